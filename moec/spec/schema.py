"""The JSON Schema editors use to check and complete spec files (`#:schema` directive)."""

from __future__ import annotations

import json
from typing import Any

from moec.spec.models import Spec

SCHEMA_ID = "https://moec.dev/schemas/moec-spec.schema.json"


def spec_schema() -> dict[str, Any]:
    """JSON Schema of a spec file, from the pydantic models and their field docstrings.

    The [model] keys are not required in the schema: a preset can supply them, and only
    `moec validate` knows which preset fills what.
    """
    schema = Spec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    schema["title"] = "moec spec"
    schema["$defs"]["Model"].pop("required", None)
    return schema


def schema_text() -> str:
    return json.dumps(spec_schema(), indent=2, sort_keys=True) + "\n"


def is_moec_schema(data: bytes) -> bool:
    """Whether a file's bytes are a schema `moec schema` wrote (which `schema -o` may replace)."""
    try:
        return json.loads(data).get("$id") == SCHEMA_ID
    except (ValueError, AttributeError, RecursionError):
        return False
