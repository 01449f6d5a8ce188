"""`moec tune` on the CPU: the check every candidate passes before it is timed (real operands and
reference, fake launchers), the table it writes and `moec build` reads, the messages of a
machine that cannot tune, and one tiny real tune of the interpreted kernels."""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLES

import moec
from moec.cli import main
from moec.plan import Environment, make_plan, plan_loaded
from moec.plan.tables import BUCKET_KEYS, TUNED_DIR
from moec.runtime import torch_matmul
from moec.spec import load_spec
from moec.tune import candidates, command
from moec.tune.gemm import GemmDims, GemmTuner
from moec.tune.measure import Timer, run_trials
from moec.tune.progress import Progress
from moec.tune.run import Search, TunedLayer, tune_layer

SCHEMES = ["bf16", "fp8_per_tensor", "fp8_block", "mxfp8", "mxfp4"]
GOOD = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_SIZE_M": 8, "num_warps": 8}
WRONG = {**GOOD, "num_warps": 4, "WARP_SPECIALIZE": True}
BROKEN = {**GOOD, "BLOCK_N": 1024}
TIMER = Timer("cpu", warmup=0, repeats=1)


def torch_matmul_of(scheme):
    """The torch backend's matmul of `scheme`: a correct grouped GEMM, one expert at a time."""
    return {
        "bf16": torch_matmul.matmul_bf16,
        "fp8_per_tensor": torch_matmul.matmul_fp8_per_tensor,
        "fp8_block": functools.partial(
            torch_matmul.matmul_block_scaled, group=128, block=(128, 128)
        ),
        "mxfp8": functools.partial(torch_matmul.matmul_block_scaled, group=32, block=(1, 32)),
        "mxfp4": torch_matmul.matmul_mxfp4,
    }[scheme]


def fake_grouped_gemm(a, a_scale, w, w_scale, out, *, scheme, config, m_indices, num_rows):
    """A launcher with grouped_gemm's signature: right for most configs, off by 30% for the
    warp-specialized 4-warp one (as the H200 once was, FACTS.md), refusing BLOCK_N 1024."""
    if config["BLOCK_N"] > 256:
        raise ValueError("out of shared memory")
    matmul = torch_matmul_of(scheme)
    for e in m_indices[m_indices >= 0].unique().tolist():
        rows = (m_indices == e).nonzero().flatten()
        a_rows = a_scale if a_scale is None or a_scale.dim() < 2 else a_scale[rows]
        scale = None if w_scale is None else w_scale[e]
        out[rows] = matmul(a[rows], a_rows, w[e], scale, out_dtype=out.dtype)
    if config.get("WARP_SPECIALIZE") and config["num_warps"] == 4:
        out.mul_(1.3)
    return out


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_wrong_candidate_is_rejected_before_it_is_timed(scheme):
    dims = GemmDims(scheme, hidden=256, intermediate=128, experts=4, top_k=2, dtype=torch.bfloat16)
    tuner = GemmTuner(fake_grouped_gemm, dims, "cpu")
    timed = []

    def timer(fn):
        timed.append(fn)
        return 1.0

    choice, trials = tuner.bucket(8, [GOOD, WRONG, BROKEN], timer, lambda: None)
    notes = {json.dumps(t.config, sort_keys=True): t.note for t in trials}
    assert notes[json.dumps(GOOD, sort_keys=True)] == ""
    assert notes[json.dumps(WRONG, sort_keys=True)].startswith("wrong: error up to ")
    assert notes[json.dumps(BROKEN, sort_keys=True)] == "failed: ValueError: out of shared memory"
    assert len(timed) == 2  # the good config, once per GEMM
    assert choice.gate_up.config == GOOD and choice.down.config == GOOD


def test_the_check_bound_comes_from_the_format():
    """The torch backend's fp32 matmul passes; one bf16 ulp more on one element does not pass
    where the element is large (the bound is u * |ref| + fp32 accumulation)."""
    dims = GemmDims("bf16", hidden=256, intermediate=128, experts=4, top_k=2, dtype=torch.float32)
    tuner = GemmTuner(fake_grouped_gemm, dims, "cpu")
    routing = tuner.routing(8, 16)
    nudged = []

    def nudge(*args, **kwargs):
        out = fake_grouped_gemm(*args, **kwargs)
        if kwargs["config"]["num_warps"] == 2:
            out.mul_(1 + 2**-12)  # fp32 output: 2**-12 is far above u = 2**-24
            nudged.append(True)
        return out

    tuner.grouped_gemm = nudge
    trials = tuner.trials("down", routing, [GOOD, {**GOOD, "num_warps": 2}], TIMER, lambda: None)
    assert trials[0].ms is not None and trials[1].note.startswith("wrong")
    assert nudged


def test_run_trials_counts_every_candidate_and_never_times_a_failure():
    steps = []

    def check(config):
        if config["x"] == 2:
            raise RuntimeError("compile error\nwith details")
        return "off" if config["x"] == 3 else None

    trials = run_trials(
        [{"x": 1}, {"x": 2}, {"x": 3}],
        check,
        lambda c: None,
        lambda fn: 5.0,
        lambda: steps.append(1),
    )
    assert [t.ms for t in trials] == [5.0, None, None]
    assert [t.note for t in trials] == ["", "failed: RuntimeError: compile error", "wrong: off"]
    assert len(steps) == 3


def test_candidates_fit_the_scheme_and_the_gpu():
    mx = candidates.gemm_candidates(1, 256, 8, "mxfp4", tma=True)
    assert mx and not any(c.get("SWAP_AB") or c.get("TMA") or "FP8_ACC" in c for c in mx)
    fp8 = candidates.gemm_candidates(4096, 256, 8, "fp8_block", tma=True)
    assert any(c.get("FP8_ACC") == 128 for c in fp8) and any(c.get("TMA") for c in fp8)
    assert not any(c.get("TMA") for c in candidates.gemm_candidates(4096, 256, 8, "bf16", False))
    assert all(c["num_warps"] == 8 for c in fp8 if c.get("WARP_SPECIALIZE"))
    assert all(c["BLOCK_K"] == 128 for c in fp8)
    decode = candidates.gemm_candidates(1, 256, 8, "fp8_block", tma=True)
    late = [c for c in decode if c.get("FP8_ACC") == 128]
    assert late and any(c.get("SWAP_AB") for c in decode)  # 16-row swap-AB: every 32 only
    assert not any(c.get("SWAP_AB") and c["BLOCK_M"] < 32 for c in late)
    tiles = candidates.elementwise_candidates("combine")
    assert set(tiles[0]) == {"BLOCK_T", "BLOCK_H", "num_warps", "TERMS_AT_ONCE"}
    assert {"BLOCK_T": 1, "BLOCK_H": 512, "num_warps": 1, "TERMS_AT_ONCE": 4} in tiles
    for kernel in candidates.ELEMENTWISE_KERNELS:  # none gives a thread more than 256 values
        for tile in candidates.elementwise_candidates(kernel):
            rows, columns = tile[candidates.ROWS_KEY[kernel]], tile[candidates.COLUMNS_KEY[kernel]]
            per_thread = rows * columns * tile.get("TERMS_AT_ONCE", 1) / (32 * tile["num_warps"])
            assert per_thread * (2 if kernel == "act" else 1) <= 256


def test_a_tiny_real_tune_of_the_interpreted_kernels(cache_dir):
    """Two GEMM candidates and one tile per elementwise kernel, TRITON_INTERPRET=1 (conftest)."""
    loaded = load_spec(EXAMPLES / "tiny-cpu-triton.toml", ["experts.layout=contiguous"])
    layer = plan_loaded(loaded).layer
    package = moec.load(loaded, cache_dir=cache_dir)
    gemm = {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4}
    configs = [{**gemm, "num_stages": 1}, {**gemm, "BLOCK_N": 64, "num_stages": 1}]
    tiles = {
        "permute": {"BLOCK_M": 8, "BLOCK_H": 256, "num_warps": 4},
        "act": {"BLOCK_M": 8, "BLOCK_I": 128, "num_warps": 4},
        "combine": {"BLOCK_T": 8, "BLOCK_H": 256, "num_warps": 4},
    }
    search = Search((2, 8), lambda t: configs, lambda kernel: [tiles[kernel]], 16)
    tuned = tune_layer(package, layer, search, "cpu", TIMER, Progress(16))
    assert tuned.key == "fp8_block/H256/I128/E8/K2"
    assert [b["max_tokens"] for b in tuned.buckets] == [2, None]
    for bucket in tuned.buckets:
        assert bucket["gate_up"] in configs and bucket["down"] in configs
        assert bucket["block_m"] == 32 and bucket["ms"] > 0
    for kernel, config in tuned.elementwise.items():
        assert config in (tiles[kernel], getattr(package.tiles, kernel.upper()))


def test_the_table_written_is_the_shipped_format_and_builds_read_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps({"bf16/H1/I1/E1/K1": [{"kept": True}]}))
    key = "fp8_block/H7168/I2048/E256/K8"
    bucket = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_SIZE_M": 8, "num_warps": 4}
    bucket["num_stages"] = 3
    buckets = [
        {"max_tokens": 4, "block_m": 16, "gate_up": bucket, "down": bucket, "ms": 0.2},
        {"max_tokens": None, "block_m": 16, "gate_up": bucket, "down": bucket, "ms": 0.3},
    ]
    elementwise = {
        "permute": {"BLOCK_M": 4, "BLOCK_H": 2048, "num_warps": 4},
        "act": {"BLOCK_M": 4, "BLOCK_I": 2048, "num_warps": 4},
        "combine": {"BLOCK_T": 4, "BLOCK_H": 2048, "num_warps": 4},
    }
    command.write_table(path, TunedLayer(key, buckets, elementwise))
    table = json.loads(path.read_text())
    shipped = json.loads((moec.plan.tuning.TUNED_DIR / "h200.json").read_text())
    assert list(table) == ["bf16/H1/I1/E1/K1", key, f"elementwise/{key}"]
    assert set(table[f"elementwise/{key}"]) == set(shipped[f"elementwise/{key}"])
    for record in table[key]:
        assert set(record) == set(shipped[key][0]) and set(BUCKET_KEYS) <= set(record)
    spec = load_spec(EXAMPLES / "deepseek-v3-fp8.toml").spec
    plan = make_plan(spec, Environment(frozenset({"triton"}), tmp_path))
    assert plan.tiles.permute == elementwise["permute"]
    shipped_only = make_plan(spec, Environment(frozenset({"triton"})))
    assert shipped_only.tiles.permute == shipped[f"elementwise/{key}"]["permute"]
    assert [b.max_tokens for b in plan.tiles.buckets] == [4, None]
    assert not list(tmp_path.glob(".*.tmp"))


def test_tune_without_a_gpu_says_so(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["tune", str(EXAMPLES / "deepseek-v3-fp8.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moec tune: no CUDA GPU here (torch.cuda.is_available() is False)")
    assert "Traceback" not in err


def test_tune_without_a_gpu_from_the_shell():
    done = subprocess.run(
        [sys.executable, "-m", "moec", "tune", str(EXAMPLES / "deepseek-v3-fp8.toml")],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 2 and "no CUDA GPU here" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture
def fake_h100(monkeypatch, tmp_path):
    """This machine as an H100 (sm90) whose measurements `tune_layer` fakes."""
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(command.moec, "load", lambda loaded: None)

    def measured(package, layer, search, device, timer, progress):
        assert device == "cuda" and search.tokens == (1, 16, 64, 256)
        config = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4}
        bucket = {"max_tokens": None, "block_m": 16, "gate_up": config, "down": config, "ms": 1}
        return TunedLayer("fp8_block/H7168/I2048/E256/K8", [bucket], {"permute": {}})

    monkeypatch.setattr(command, "tune_layer", measured)
    return tmp_path


def test_tune_writes_the_local_gpus_table_and_says_how_builds_use_it(fake_h100, capsys):
    spec = str(EXAMPLES / "deepseek-v3-fp8.toml")
    assert main(["tune", spec, "--set", "target.max_num_tokens=256"]) == 0
    out = capsys.readouterr().out.splitlines()
    table = fake_h100 / "nvidia-h100-80gb-hbm3.json"
    assert out == [
        f"wrote {table}: fp8_block/H7168/I2048/E256/K8, 1 bucket",
        'moec build uses it for specs with target.gpu = "nvidia-h100-80gb-hbm3" (in [target], '
        "or --set target.gpu=nvidia-h100-80gb-hbm3)",
    ]
    assert "fp8_block/H7168/I2048/E256/K8" in json.loads(table.read_text())


def test_tune_output_is_checked_before_measuring_and_never_a_users_file(
    fake_h100, capsys, monkeypatch
):
    """-o may name a new file or a table moec tune wrote; a user's file, a link or a folder is
    refused before the minutes of measuring, and left as it is."""
    spec = str(EXAMPLES / "deepseek-v3-fp8.toml")
    notes = fake_h100 / "notes.json"
    notes.write_text('{"my_notes": "keep"}')
    link = fake_h100 / "link.json"
    link.symlink_to(notes)
    measured = command.tune_layer
    monkeypatch.setattr(command, "tune_layer", lambda *args: pytest.fail("measured"))
    for out, says in [
        (str(notes), "was not written by moec"),
        (str(link), "symbolic link"),
        (str(fake_h100), "is a folder"),
        ("", '-o = "": is empty'),
    ]:
        assert main(["tune", spec, "-o", out]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err
    assert notes.read_text() == '{"my_notes": "keep"}' and link.is_symlink()
    # a table moec tune wrote is added to
    monkeypatch.setattr(command, "tune_layer", measured)
    table = fake_h100 / "mine.json"
    table.write_text(json.dumps({"bf16/H1/I1/E1/K1": [{"kept": True}]}))
    assert main(["tune", spec, "--set", "target.max_num_tokens=256", "-o", str(table)]) == 0
    assert set(json.loads(table.read_text())) >= {"bf16/H1/I1/E1/K1"}


def test_tune_does_not_write_through_a_file_at_a_staging_name(fake_h100, capsys):
    """A link where an older moec staged its table (.<table>.tmp) is not followed."""
    victim = fake_h100 / "victim.txt"
    victim.write_text("a user's file")
    staging = fake_h100 / ".nvidia-h100-80gb-hbm3.json.tmp"
    staging.symlink_to(victim)
    spec = str(EXAMPLES / "deepseek-v3-fp8.toml")
    assert main(["tune", spec, "--set", "target.max_num_tokens=256"]) == 0
    table = fake_h100 / "nvidia-h100-80gb-hbm3.json"
    assert victim.read_text() == "a user's file" and staging.is_symlink()
    assert not table.is_symlink() and "fp8_block/H7168/I2048/E256/K8" in table.read_text()


@pytest.mark.parametrize(
    ("example", "overrides", "says"),
    [
        ("deepseek-v3-fp8", ["target.gpu=nvidia-h200"], 'target.gpu = "nvidia-h200": names '),
        ("deepseek-v3-fp8", ["target.arch=sm100"], '"sm100": this GPU (NVIDIA H100 80GB HBM3) is'),
        ("tiny-cpu-triton", [], 'target.device = "cpu": moec tune measures a CUDA layer'),
        ("deepseek-v3-fp8", ["target.max_num_tokens=0"], "target.max_num_tokens = 0"),
    ],
)
def test_tune_refuses_what_this_gpu_cannot_tune(fake_h100, capsys, example, overrides, says):
    args = [f"--set={o}" for o in overrides]
    assert main(["tune", str(EXAMPLES / f"{example}.toml"), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_lines_in_a_log_and_a_bar_on_a_terminal():
    log = io.StringIO()
    progress = Progress(4, log)
    progress.begin("T=1", 4)
    for _ in range(4):
        progress.step()
    progress.line("T=1: done")
    assert log.getvalue() == "T=1: 4 candidates\nT=1: done\n"
    terminal = Terminal()
    progress = Progress(4, terminal)
    progress.begin("T=1", 4)
    progress.step()
    assert "T=1: 4 candidates\n" in terminal.getvalue()
    assert terminal.getvalue().endswith("\r\033[K[#######.......................] 1/4 T=1 (0 s)")


def test_shipped_tables_promote_swap_ab_tiles_of_16_rows_every_32():
    """No shipped config sums 128 K elements in the fp8 tensor core on a 16-row swap-AB tile:
    each one that did exceeded the fp32 bound in the H200 kernel suite (RESULTS.md, run 51)."""
    shipped = Path(candidates.__file__).parents[1] / "plan" / "tuned"
    for table in shipped.glob("*.json"):
        for key, buckets in json.loads(table.read_text()).items():
            if key.startswith(("elementwise/", "backends/")):
                continue
            for bucket in buckets:
                for config in (bucket["gate_up"], bucket["down"]):
                    assert candidates._may_promote_late(config) or "FP8_ACC" not in config, (
                        table.name,
                        key,
                        bucket["max_tokens"],
                    )


def test_the_shipped_h200_tiles_are_among_the_candidates():
    """Re-tuning can find every config of the shipped DeepSeek-V3 tables: each bucket's gate/up
    and down configs are candidates at its token count (the 128-wide, 4-stage mid-size tiles of
    runs 65-66 were once missing from the grid)."""
    table = json.loads((TUNED_DIR / "h200.json").read_text())
    for key in ("fp8_block/H7168/I2048/E256/K8", "bf16/H7168/I2048/E256/K8"):
        scheme = key.split("/")[0]
        for bucket in table[key]:
            if bucket["max_tokens"] is None:
                continue
            found = candidates.gemm_candidates(bucket["max_tokens"], 256, 8, scheme, tma=True)
            for role in ("gate_up", "down"):
                assert bucket[role] in found, (key, bucket["max_tokens"], role)


def test_tune_says_its_triton_backend_is_why(capsys):
    """tune measures the Triton GEMMs whatever the spec's gemm_backend: a torch spec for sm80
    (valid) is refused for tune's Triton, which the message says, without offering the torch
    backend the spec already has."""
    spec = EXAMPLES / "tiny-cpu.toml"  # fp8_block, gemm_backend = "torch"
    assert load_spec(spec).spec.experts.gemm_backend == "torch"
    overrides = ["--set", "target.device=cuda", "--set", "target.arch=sm80"]
    assert main(["validate", str(spec), *overrides]) == 0
    capsys.readouterr()
    assert main(["tune", str(spec), *overrides]) == 2
    err = capsys.readouterr().err
    assert "and moec tune measures the Triton GEMMs" in err and "Traceback" not in err
    assert 'gemm_backend = "torch"' not in err
