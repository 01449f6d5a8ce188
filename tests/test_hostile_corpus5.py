"""A fifth hostile corpus: `moec build -o -` is refused as eplb's and tune's are (not a folder
named "-"); ... Each is exit 2, one line, nothing written."""

from __future__ import annotations

import os

import pytest
from clihelp import cli, refused, snapshot
from conftest import EXAMPLES

TINY = EXAMPLES / "tiny-cpu.toml"


# --- -o - ------------------------------------------------------------------------------------


def test_build_refuses_standard_output_as_its_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, "build", TINY, "-o", "-")
    assert err == (
        'moec build: -o = "-": is standard output, and moec build writes its package to a '
        "folder (a folder's path, or leave -o out for out/)\n"
    )
    assert snapshot(tmp_path) == {}
    assert not os.path.exists("-")


# --- floats that underflow in the kernels' float32 -------------------------------------------

TINY_FLOAT = "is below 1e-06, the smallest a float key takes"
FLOAT_KEYS = {  # the --set that makes the key count, the key
    "router.routed_scaling_factor": (),
    "activation.swiglu_limit": ("activation.kind=silu_clamped",),
    "activation.alpha": ("activation.kind=oai_swiglu",),
    "activation.limit": ("activation.kind=oai_swiglu",),
    "activation.beta": ("activation.kind=situ", "activation.linear_beta=1.0"),
    "activation.linear_beta": ("activation.kind=situ", "activation.beta=1.0"),
    "experts.masked_memory_budget_gib": (),
}


@pytest.mark.parametrize("value", ["1e-300", "5e-324", "1e-7"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_a_positive_float_that_underflows_float32_is_refused_by_key(key, value, capsys):
    """A SiTU beta of 1e-300 is 0 in float32: the layer divided by it, every output nan; a
    scaling factor or clamp of 1e-300 silently zeroed the experts. Each float key takes 1e-6
    (MAX_FLOAT's reciprocal) or more."""
    sets = [arg for item in FLOAT_KEYS[key] for arg in ("--set", item)]
    err = refused(capsys, "validate", TINY, *sets, "--set", f"{key}={value}")
    assert f"{key} = {float(value)!r}: {TINY_FLOAT}" in err
    assert err.rstrip().endswith("(1e-06 or more)")


def test_the_smallest_float_is_taken(capsys):
    code, out, err = cli(capsys, "validate", TINY, "--set", "router.routed_scaling_factor=1e-6")
    assert (code, out, err) == (0, "ok\n", "")


# --- rules that follow from another rule ------------------------------------------------------


def test_fused_shared_experts_without_shared_experts_is_one_problem(capsys):
    """With no shared experts, quant.shared_scheme is None: the fused rule also said
    'quant.shared_scheme = None: fused shared experts need the routed experts' scheme'."""
    err = refused(
        capsys, "validate", TINY, "--set", "model.n_shared_experts=0",
        "--set", "experts.shared_experts=fused",
    )  # fmt: skip
    assert "there are no shared experts to fuse (n_shared_experts = 0)" in err
    assert "None" not in err
