"""The JSON Schema of spec files (`moec schema`): committed, in step with the models, and
complete enough for an editor to check and document every key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moec.cli import main
from moec.resources import shipped_schema_path
from moec.spec import models
from moec.spec.schema import SCHEMA_ID, schema_text, spec_schema

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "schemas" / "moec-spec.schema.json"
TABLES = {
    "Model": models.Model,
    "Router": models.Router,
    "Quant": models.Quant,
    "Silu": models.Silu,
    "SiluClamped": models.SiluClamped,
    "OaiSwiglu": models.OaiSwiglu,
    "Situ": models.Situ,
    "Experts": models.Experts,
    "Parallel": models.Parallel,
    "Target": models.Target,
}


def test_committed_schema_is_up_to_date():
    assert COMMITTED.read_text(encoding="utf-8") == schema_text(), (
        "schemas/moec-spec.schema.json drifted from the models: run `moec schema`"
    )


def test_shipped_schema_is_the_committed_one():
    assert shipped_schema_path().read_text(encoding="utf-8") == schema_text()


def test_schema_command_writes_the_same_text(tmp_path, capsys):
    out = tmp_path / "nested" / "spec.schema.json"
    assert main(["schema", "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    assert out.read_text(encoding="utf-8") == schema_text()


def test_schema_command_prints_for_a_dash(tmp_path, monkeypatch, capsys):
    """-o - is standard output, as for init and explain: no file named "-"."""
    monkeypatch.chdir(tmp_path)
    assert main(["schema", "-o", "-"]) == 0
    assert capsys.readouterr().out == schema_text()
    assert list(tmp_path.iterdir()) == []


def test_schema_command_default_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["schema"]) == 0
    written = tmp_path / "schemas" / "moec-spec.schema.json"
    assert written.read_text(encoding="utf-8") == schema_text()


def test_schema_text_is_stable():
    assert schema_text() == schema_text()
    assert json.loads(schema_text()) == spec_schema()


def test_schema_header():
    schema = spec_schema()
    assert schema["$id"] == SCHEMA_ID
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "moec spec"
    assert schema["required"] == ["name", "model"]
    assert schema["additionalProperties"] is False


def test_schema_has_every_table_and_key():
    schema = spec_schema()
    assert set(schema["properties"]) == set(models.Spec.model_fields)
    for name, table in TABLES.items():
        definition = schema["$defs"][name]
        assert set(definition["properties"]) == set(table.model_fields), name
        assert definition["additionalProperties"] is False, f"{name} accepts unknown keys"
        assert definition.get("description"), f"{name} has no docstring"


def test_every_key_is_documented():
    """Field docstrings reach the schema, so editors show them on hover."""
    schema = spec_schema()
    for name, definition in [("Spec", schema), *schema["$defs"].items()]:
        for key, prop in definition["properties"].items():
            if "$ref" in prop or "oneOf" in prop:
                continue  # a table: its own definition carries the description
            assert prop.get("description"), f"{name}.{key} has no docstring"


def test_model_keys_are_not_required_in_the_schema():
    """A preset can fill [model]; only `moec validate` knows which keys it fills."""
    assert "required" not in spec_schema()["$defs"]["Model"]


def test_enums_match_the_models():
    quant = spec_schema()["$defs"]["Quant"]["properties"]
    assert quant["scheme"]["enum"] == ["bf16", "fp8_per_tensor", "fp8_block", "mxfp8", "mxfp4"]
    kinds = spec_schema()["properties"]["activation"]["discriminator"]["mapping"]
    assert set(kinds) == {"silu", "silu_clamped", "oai_swiglu", "situ"}


def test_target_gpu_is_a_slug_in_the_schema():
    """Editors check target.gpu as `moec tune` names GPUs (the model's validator checks the same)."""
    gpu = spec_schema()["$defs"]["Target"]["properties"]["gpu"]
    string = next(option for option in gpu["anyOf"] if option.get("type") == "string")
    assert string["pattern"] == f"^{models.GPU_NAME}$"
    assert string["maxLength"] == models.GPU_NAME_LENGTH
    assert {"type": "null"} in gpu["anyOf"] and gpu["default"] is None


def test_examples_conform_to_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    import tomli

    validator = jsonschema.Draft202012Validator(spec_schema())
    for example in sorted((ROOT / "examples").glob("*.toml")):
        data = tomli.loads(example.read_text(encoding="utf-8"))
        errors = list(validator.iter_errors(data))
        assert not errors, f"{example.name}: {errors[0].message}"
