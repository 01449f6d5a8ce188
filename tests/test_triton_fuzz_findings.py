"""What benchmarks/fuzz_triton.py (random small valid specs, the Triton backend interpreted
against the torch backend) found, and a seeded sample of its cases as a regression guard.

The bound is tests/test_triton_layer.py's: 2**-7 of the torch output's norm.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from moec.errors import MoecError
from moec.spec import parse_spec

FUZZ = Path(__file__).resolve().parent.parent / "benchmarks" / "fuzz_triton.py"


def _fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_triton", FUZZ)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuzz = _fuzz()


def _small(case: dict) -> bool:
    """Cases of a second or so on the interpreter."""
    model = case["model"]
    return (
        case["tokens"] <= 17
        and model["hidden_size"] * model["moe_intermediate_size"] <= 160 * 96
        and model["n_routed_experts"] <= 8
    )


def _sample(seed: int, count: int) -> list[dict]:
    rng, cases = random.Random(seed), []
    while len(cases) < count:
        case = fuzz.draw(rng)
        if not _small(case):
            continue
        try:
            parse_spec(fuzz.spec_text(case, "triton"), "fuzz.toml")
            parse_spec(fuzz.spec_text(case, "torch"), "fuzz.toml")
        except MoecError:
            continue
        cases.append(case)
    return cases


SAMPLE = _sample(seed=2026, count=6)


@pytest.mark.parametrize("case", SAMPLE, ids=[f"case{i}" for i in range(len(SAMPLE))])
def test_a_seeded_sample_of_fuzz_cases_passes(case, cache_dir):
    assert fuzz.run_case(case, cache_dir) == [], fuzz.repro(case)


# --- findings -----------------------------------------------------------------------------

MX_SHARED = """
name = "mx_shared_hidden"
[model]
hidden_size = {hidden}
moe_intermediate_size = 64
n_routed_experts = 4
num_experts_per_tok = 2
n_shared_experts = 1
[quant]
scheme = "bf16"
shared_scheme = "{shared}"
[experts]
gemm_backend = "{backend}"
shared_experts = "separate"
[target]
device = "cpu"
max_num_tokens = 8
"""


@pytest.mark.parametrize("hidden", [16, 200])
def test_an_mx_shared_scheme_on_a_hidden_size_its_groups_do_not_divide(hidden):
    """Finding 1: validation took an mxfp8 shared scheme whose 1x32 groups do not divide
    hidden_size (the Triton shared GEMM then raised "mxfp8 needs BLOCK_K and K multiples of
    32" at the first forward); now refused at model.hidden_size, on either backend."""
    for backend in ("triton", "torch"):
        with pytest.raises(MoecError) as raised:
            parse_spec(MX_SHARED.format(hidden=hidden, shared="mxfp8", backend=backend), "s.toml")
        assert [p.path for p in raised.value.problems] == ["model.hidden_size"]
