"""Every shipped example (`examples/*.toml`) validates, starts with the schema directive that
editors follow, and names a package of its own."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import moec
from moec.cli import main
from moec.plan import plan_loaded
from moec.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
DIRECTIVE = "#:schema ../schemas/moec-spec.schema.json"


def test_there_are_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_example_validates(example: Path, capsys):
    assert main(["validate", "--portable", str(example)]) == 0
    assert capsys.readouterr() == ("ok\n", "")


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_example_starts_with_the_schema_directive(example: Path):
    first = example.read_text(encoding="utf-8").splitlines()[0]
    assert first == DIRECTIVE
    target = (example.parent / first.removeprefix("#:schema ")).resolve()
    assert target == (ROOT / "schemas" / "moec-spec.schema.json").resolve()
    assert target.is_file()


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_example_is_described(example: Path):
    """A comment under the directive says what the example is."""
    second = example.read_text(encoding="utf-8").splitlines()[1]
    assert second.startswith("# ") and len(second) > 10


def test_examples_validate_together(capsys):
    assert main(["validate", "--portable", *map(str, EXAMPLES)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [f"{example}: ok" for example in EXAMPLES]


def test_example_names_are_distinct():
    """Each example builds into out/<name>/: two examples must not share a package."""
    names = [load_spec(example).spec.name for example in EXAMPLES]
    assert len(names) == len(set(names))


def test_example_hash_ignores_formatting():
    """The content hash is of the normalized spec: comments and key order do not change it."""
    example = ROOT / "examples" / "tiny-cpu.toml"
    loaded = load_spec(example)
    text = "\n".join(line for line in loaded.text.splitlines() if not line.startswith("#")).replace(
        "[model]", "# the layer\n[model]"
    )
    assert parse_spec(text).content_hash == loaded.content_hash


RUN_BUDGET_BYTES = 256 * 2**20
"""Examples whose weights fit this run a forward on the CPU in CI; DeepSeek-size ones build and
import only (their random weights alone would take minutes and gigabytes here)."""


def _cpu_overrides(example: Path) -> list[str] | None:
    """The example as it runs on this CPU: as written, or with target.device=cpu (its GPU-only
    keys left out or replaced, moec/spec/cpu.py) where the rules allow it; None where not."""
    if load_spec(example).spec.target.device == "cpu":
        return []
    try:
        load_spec(example, ["target.device=cpu"])
    except moec.MoecError:
        return None
    return ["target.device=cpu"]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_example_builds_imports_and_runs_where_it_can(example: Path, load_layer):
    if plan_loaded(load_spec(example)).missing:  # refused where its GPU-only backend is missing
        with pytest.raises(moec.MoecError, match="not installed here"):
            load_layer(example)
        return
    overrides = _cpu_overrides(example)
    package = load_layer(example, *(overrides or []))
    assert hasattr(package, "MoELayer")
    weights = package.weights.PARAMETERS.values()
    size = sum(
        math.prod(shape) * torch.empty((), dtype=dtype).element_size() for shape, dtype in weights
    )
    if overrides is None or size > RUN_BUDGET_BYTES or package.PLAN["choices"]["dims"]["ep"] > 1:
        return  # built and imported; too big (or multi-rank) to run here
    layer = package.MoELayer().random_(0)
    x = torch.randn(5, package.layer.HIDDEN).to(package.layer.DTYPE)
    out = layer(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
