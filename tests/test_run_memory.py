"""`moec run` checks its real peak before it allocates: random weights are made at about two and
a half times their size (moec/spec/memory.py: making_bytes), measured by scripts/weights_peak.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import torch
from clihelp import assert_refused, cli
from conftest import EXAMPLES, ROOT

from moec import runner
from moec.spec import load_spec, memory

TINY = EXAMPLES / "tiny-cpu.toml"


def _never(*args, **kwargs):
    raise AssertionError("allocated before the memory check")


def _sizes(load_layer, tokens: int) -> tuple[int, float, float]:
    """(parameter bytes, their making's peak, the forward's bytes) of tiny-cpu's run."""
    spec = load_spec(str(TINY), []).spec
    weights = runner.parameter_bytes(load_layer(TINY))
    forward = memory.layer_bytes(spec, tokens).activations
    return (
        weights,
        memory.making_bytes(spec, weights),
        forward + memory.run_bytes(spec, tokens, False),
    )


def test_room_for_the_forward_but_not_for_making_the_weights_is_refused(
    load_layer, capsys, monkeypatch
):
    """The check before counted the weights once: a host with room for them and the forward,
    but not for the copies random_ makes, was let through and killed on the way."""
    weights, making, forward = _sizes(load_layer, 16)
    free = int(weights + forward) + 1
    assert free < making  # what the old check let through
    monkeypatch.setattr(runner, "_free_memory", lambda device: free)
    monkeypatch.setattr(torch, "randn", _never)
    code, out, err = cli(capsys, "run", TINY, "--tokens", "16")
    assert_refused(
        code,
        out,
        err,
        "--tokens = 16",
        "the layer (H=256, I=128, E=16 + 1 shared, K=4, fp8_block)",
        f"needs at least {memory.show_bytes(making)} at its peak",
        f"more than the {memory.show_bytes(free)} free on this cpu",
        f"made at a peak of {memory.show_bytes(making)} ({making / weights:.2f}x",
    )


def test_room_for_the_peak_runs(load_layer, capsys, monkeypatch):
    weights, making, forward = _sizes(load_layer, 16)
    monkeypatch.setattr(runner, "_free_memory", lambda device: int(max(making, weights + forward)))
    code, out, err = cli(capsys, "run", TINY, "--tokens", "16")
    assert code == 0, err
    assert "checksum" in out


def test_the_estimate_covers_the_measured_peak_of_random_weights(tmp_path):
    """random_'s peak resident memory, measured in a fresh process, at dims whose projections are
    large enough that the allocator returns them (8M values): over the two copies the
    estimate counts, and under the estimate."""
    dims = [
        "model.hidden_size=4096",
        "model.moe_intermediate_size=2048",
        "model.n_routed_experts=16",
        "model.num_experts_per_tok=2",
        "router.n_group=1",
        "router.topk_group=1",
    ]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "weights_peak.py"), str(TINY), *dims],
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    found = re.search(r"\((\d+\.\d+)x\), estimate .* \((\d+\.\d+)x\)", done.stdout)
    measured, estimate = float(found[1]), float(found[2])
    assert memory.WEIGHT_COPIES - 0.1 <= measured <= estimate, done.stdout
