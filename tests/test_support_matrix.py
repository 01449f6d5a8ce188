"""Every combination of the support matrix that validates builds, imports and runs.

The matrix: scheme x layout x shared experts (separate, fused, none) x GEMM backend (torch,
triton) x dispatch (local, all2all on 2 ranks) x tensor parallelism (1, 2). Each combination
either fails validation with a located message (never a traceback) or builds a package that
imports. Those that run on the CPU run a forward: torch on one rank here; expert- and
tensor-parallel layers on 2 gloo ranks, against the one-rank torch layer of the same spec; the
Triton ones under the interpreter (a chosen few: it is slow).

Bounds, from the number formats (docs/numerics.md): two layers that quantize the same values
the same way differ by fp32 summation order and one bf16 rounding of each output: 2**-7
norm-wise (test_triton_layer.py derives it). Tensor-parallel ranks quantize their own halves of
the intermediate; with one per-tensor activation scale the two halves get other scales than the
whole, so each e4m3 value may round differently: two e4m3 roundings, 2u = 2**-3.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import dist_worker
import pytest
import torch
import torch.multiprocessing as mp

from moec.cli import main
from moec.errors import MoecError
from moec.spec import parse_spec

SPEC = """
name = "matrix"
[model]
hidden_size = 256
moe_intermediate_size = 256
n_routed_experts = 8
num_experts_per_tok = 2
n_shared_experts = 1
[router]
scoring_func = "sigmoid"
topk_method = "noaux_tc"
n_group = 2
topk_group = 1
norm_topk_prob = true
routed_scaling_factor = 2.5
[target]
device = "cpu"
max_num_tokens = 64
"""
HIDDEN = 256
SCHEMES = {
    "bf16": [],
    "fp8_per_tensor": ["quant.checkpoint=bf16"],
    "fp8_block": ["quant.checkpoint=bf16"],
    "mxfp8": ["quant.checkpoint=bf16"],
    "mxfp4": ["quant.checkpoint=quantized"],
}
SHARED_SCHEME = {"mxfp4": ["quant.shared_scheme=mxfp4"]}
"""Where there are shared experts: mxfp4 ones too (their default would be fp8_block)."""
SHARED = {
    "separate": ["experts.shared_experts=separate"],
    "fused": ["experts.shared_experts=fused"],
    "none": ["model.n_shared_experts=0"],
}
DISPATCH = {
    "local": [],
    "all2all": ["parallel.dispatch=all2all", "parallel.ep_size=2"],
}


def overrides_of(scheme, layout, shared, backend, dispatch, tp) -> list[str]:
    return [
        f"quant.scheme={scheme}",
        *SCHEMES[scheme],
        f"experts.layout={layout}",
        *SHARED[shared],
        *(SHARED_SCHEME.get(scheme, []) if shared != "none" else []),
        f"experts.gemm_backend={backend}",
        *DISPATCH[dispatch],
        f"parallel.tp_size={tp}",
    ]


MATRIX = list(
    itertools.product(
        SCHEMES, ("contiguous", "masked"), SHARED, ("torch", "triton"), DISPATCH, (1, 2)
    )
)


def _id(combo) -> str:
    return "-".join(map(str, combo))


def _loaded(combo):
    """The LoadedSpec of a combination, or None when validation rejects it."""
    try:
        return parse_spec(SPEC, "matrix.toml", overrides_of(*combo))
    except MoecError as error:
        assert error.problems and all(p.message for p in error.problems)
        return None


@pytest.fixture(scope="module")
def valid():
    return [combo for combo in MATRIX if _loaded(combo) is not None]


def test_the_matrix_is_mostly_valid(valid):
    assert len(MATRIX) == 240
    assert len(valid) >= 100  # rejected: fused shared with EP or TP, TP with EP, per-tensor EP


@pytest.mark.slow
def test_every_valid_combination_builds_and_imports(valid, load_layer):
    folders = []
    for combo in valid:
        package = load_layer(SPEC, *overrides_of(*combo))
        assert hasattr(package, "MoELayer"), _id(combo)
        assert package.PLAN["choices"]["gemm_backend"] == combo[3]
        folders.append(str(Path(package.__file__).parent))
    # ruff's default rules, as a user's lint would run them on generated code
    check = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--quiet", *folders],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout


def test_one_rank_torch_combinations_run(valid, load_layer):
    x = torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(3)).bfloat16()
    ran = 0
    for combo in valid:
        scheme, layout, shared, backend, dispatch, tp = combo
        if backend != "torch" or dispatch != "local" or tp != 1:
            continue
        out = load_layer(SPEC, *overrides_of(*combo)).MoELayer().random_(11)(x)
        assert out.shape == x.shape and torch.isfinite(out).all(), _id(combo)
        ran += 1
    assert ran == 5 * 2 * 3


def _distributed_triton(combo) -> bool:
    """Triton under the interpreter costs seconds per forward: fp8_block (the quantized
    exchange) on both layouts, and bf16 once."""
    scheme, layout, shared = combo[:3]
    return shared == "separate" and (
        scheme == "fp8_block" or (scheme == "bf16" and layout == "contiguous")
    )


DISTRIBUTED = [
    combo
    for combo in MATRIX
    if (combo[4] != "local" or combo[5] != 1)
    and (combo[3] == "torch" or _distributed_triton(combo))
]


def _bound(combo) -> float:
    scheme, tp = combo[0], combo[5]
    return 2**-3 if tp > 1 and scheme == "fp8_per_tensor" else 2**-7


@pytest.mark.slow
def test_two_rank_combinations_equal_one_rank_torch(valid, load_layer, tmp_path):
    jobs, combos = [], []
    for combo in DISTRIBUTED:
        if combo not in valid:
            continue
        package = load_layer(SPEC, *overrides_of(*combo))
        folder = str(Path(package.__file__).parent)
        jobs.append((folder, package.__name__, combo[5] > 1))
        combos.append(combo)
    assert len(combos) >= 25
    tokens = 9
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(5)).bfloat16()
    split = [0, 4, tokens]
    out_file = str(tmp_path / "out")
    mp.start_processes(
        dist_worker.run_layers,
        args=(2, str(tmp_path / "init"), jobs, x, split, out_file),
        nprocs=2,
        start_method="spawn",
    )
    first, second = (torch.load(f"{out_file}.{rank}") for rank in range(2))
    for combo, a, b in zip(combos, first, second, strict=True):
        scheme, layout, shared, _, _, tp = combo
        one_rank = overrides_of(scheme, layout, shared, "torch", "local", 1)
        expected = load_layer(SPEC, *one_rank).MoELayer().random_(11)(x).double()
        out = (torch.cat([a, b]) if tp == 1 else a).double()
        if tp > 1:
            assert torch.equal(a, b), _id(combo)  # every TP rank ends with the whole sum
        error = ((out - expected).norm() / expected.norm()).item()
        assert error <= _bound(combo), f"{_id(combo)}: {error:.3g}"


def test_no_command_prints_a_traceback_over_the_matrix(capsys, tmp_path):
    """explain and validate answer every combination (0, or 2 with messages); build refuses the
    invalid ones the same way (the valid ones are built above)."""
    spec = tmp_path / "matrix.toml"
    spec.write_text(SPEC)
    for combo in MATRIX:
        sets = [item for o in overrides_of(*combo) for item in ("--set", o)]
        valid = _loaded(combo) is not None
        for command in ("validate", "explain"):
            code = main([command, str(spec), *sets])
            out, err = capsys.readouterr()
            assert code == (0 if valid else 2), f"{command} {_id(combo)}: {err}"
            assert "Traceback" not in err and (valid or err)
        if not valid:
            assert main(["build", str(spec), *sets, "-o", str(tmp_path / "out")]) == 2
            assert not (tmp_path / "out").exists()
            capsys.readouterr()
