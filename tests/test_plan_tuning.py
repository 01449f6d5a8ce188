"""Plan decisions about kernels: the torch backend's GEMM, and Triton tile tables (the user's,
written by `moec tune`, then those shipped in moec/plan/tuned/, else the default table)."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from conftest import EXAMPLES

from moec.cli import main
from moec.errors import MoecError
from moec.plan import Environment, environment, make_plan, tables
from moec.plan.environment import user_tuning_dir
from moec.plan.tables import SHIPPED_TABLES, gpu_name
from moec.plan.tuning import TUNED_DIR, router_slices, router_tiles, table_key
from moec.spec import load_spec

TRITON = Environment(frozenset({"triton"}))


def plan_of(example, *overrides):
    """The plan on a machine with Triton and the user tuning folder of $MOEC_TUNING_DIR (empty
    for every test (conftest), or the `tuning_dir` fixture's)."""
    env = Environment(frozenset({"triton"}), user_tuning_dir())
    return make_plan(load_spec(EXAMPLES / example, list(overrides)).spec, env)


def test_torch_gemm_on_cuda_bf16_is_one_launch_without_host_sync():
    contiguous = plan_of(
        "deepseek-v3-bf16.toml", "experts.gemm_backend=torch", "experts.layout=contiguous"
    )
    masked = plan_of("deepseek-v3-bf16.toml", "experts.gemm_backend=torch", "experts.layout=masked")
    assert contiguous.stage("gemm_gate_up").torch_kernel == "grouped_mm"
    assert masked.stage("gemm_down").torch_kernel == "bmm"
    for plan in (contiguous, masked):
        assert not plan.stage("gemm_gate_up").syncs_host
        assert plan.decision("CUDA graph").choice == "yes"


def test_torch_gemm_of_quantized_or_cpu_layers_loops_over_experts():
    for plan in (
        plan_of("deepseek-v3-fp8.toml", "experts.gemm_backend=torch"),
        plan_of("tiny-cpu-bf16.toml"),
    ):
        stage = plan.stage("gemm_gate_up")
        assert stage.torch_kernel == "loop" and stage.syncs_host
        assert plan.decision("CUDA graph").choice == "no"


def test_tuned_table_is_used_and_named():
    plan = plan_of("deepseek-v3-fp8.toml")
    facts = plan.layer
    tuned = json.loads((TUNED_DIR / "h200.json").read_text())
    buckets = plan.tiles.buckets
    assert [(b.max_tokens, b.block_m, b.gate_up, b.down) for b in buckets] == [
        (b["max_tokens"], b["block_m"], b["gate_up"], b["down"]) for b in tuned[table_key(facts)]
    ]
    elementwise = tuned[f"elementwise/{table_key(facts)}"]
    assert (plan.tiles.permute, plan.tiles.act, plan.tiles.combine) == (
        elementwise["permute"],
        elementwise["act"],
        elementwise["combine"],
    )
    decision = plan.decision("triton tiles")
    assert decision.reason == (
        f"tuned on nvidia-h200: moec/plan/tuned/h200.json, key {table_key(facts)}"
    )
    limits = [b.max_tokens for b in buckets]
    assert limits[-1] is None and limits[:-1] == sorted(limits[:-1])


def test_fused_shared_experts_share_the_routed_table():
    separate = plan_of("deepseek-v3-fp8.toml")
    fused = plan_of("deepseek-v3-fp8.toml", "experts.shared_experts=fused")
    assert fused.tiles.buckets == separate.tiles.buckets


def test_untuned_shapes_get_the_default_table_and_cpu_one_bucket():
    untuned = plan_of("deepseek-v3-fp8.toml", "model.hidden_size=1024")
    assert "default table" in untuned.decision("triton tiles").reason
    assert len(untuned.tiles.buckets) > 1
    cpu = plan_of("tiny-cpu-triton.toml")
    assert len(cpu.tiles.buckets) == 1 and "interpreted" in cpu.decision("triton tiles").reason


# --- user tables (moec tune) before shipped ones ------------------------------------------

V3_KEY = "fp8_block/H7168/I2048/E256/K8"
USER_BUCKETS = [
    {
        "max_tokens": 8,
        "block_m": 16,
        "gate_up": {
            "BLOCK_M": 16,
            "BLOCK_N": 32,
            "BLOCK_K": 128,
            "GROUP_SIZE_M": 8,
            "num_warps": 4,
            "num_stages": 5,
        },
        "down": {
            "BLOCK_M": 16,
            "BLOCK_N": 64,
            "BLOCK_K": 128,
            "GROUP_SIZE_M": 8,
            "num_warps": 4,
            "num_stages": 5,
        },
        "ms": 0.1,
    },
    {
        "max_tokens": None,
        "block_m": 64,
        "gate_up": {
            "BLOCK_M": 64,
            "BLOCK_N": 128,
            "BLOCK_K": 128,
            "GROUP_SIZE_M": 8,
            "num_warps": 4,
            "num_stages": 3,
        },
        "down": {
            "BLOCK_M": 64,
            "BLOCK_N": 128,
            "BLOCK_K": 128,
            "GROUP_SIZE_M": 8,
            "num_warps": 4,
            "num_stages": 3,
        },
        "ms": 1.0,
    },
]
USER_ELEMENTWISE = {
    "permute": {"BLOCK_M": 8, "BLOCK_H": 2048, "num_warps": 8},
    "act": {"BLOCK_M": 8, "BLOCK_I": 2048, "num_warps": 8},
    "combine": {"BLOCK_T": 8, "BLOCK_H": 2048, "num_warps": 8},
}


@pytest.fixture
def tuning_dir(tmp_path, monkeypatch):
    """An empty user tuning folder (MOEC_TUNING_DIR) for this test."""
    monkeypatch.setenv("MOEC_TUNING_DIR", str(tmp_path))
    return tmp_path


def write_user_table(folder, gpu, key=V3_KEY):
    table = {key: USER_BUCKETS, f"elementwise/{key}": USER_ELEMENTWISE}
    (folder / f"{gpu}.json").write_text(json.dumps(table))
    return folder / f"{gpu}.json"


def test_gpu_names_are_device_names_as_slugs():
    assert gpu_name("NVIDIA H200") == "nvidia-h200"
    assert gpu_name("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gpu_name("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"
    assert gpu_name("  NVIDIA GeForce RTX 4090 ") == "nvidia-geforce-rtx-4090"


def test_a_user_table_comes_before_the_shipped_one(tuning_dir):
    path = write_user_table(tuning_dir, "nvidia-h200")
    plan = plan_of("deepseek-v3-fp8.toml")
    assert [b.block_m for b in plan.tiles.buckets] == [16, 64]
    assert plan.tiles.buckets[0].gate_up == USER_BUCKETS[0]["gate_up"]
    assert plan.tiles.combine == USER_ELEMENTWISE["combine"]
    reason = plan.decision("triton tiles").reason
    assert reason == f"tuned on nvidia-h200: {path}, key {V3_KEY}"


def test_a_user_table_without_the_key_falls_through_to_the_shipped_one(tuning_dir):
    write_user_table(tuning_dir, "nvidia-h200", key="bf16/H16/I16/E4/K2")
    reason = plan_of("deepseek-v3-fp8.toml").decision("triton tiles").reason
    assert reason == f"tuned on nvidia-h200: moec/plan/tuned/h200.json, key {V3_KEY}"


def test_target_gpu_picks_that_gpus_table(tuning_dir):
    path = write_user_table(tuning_dir, "nvidia-h100-80gb-hbm3")
    plan = plan_of("deepseek-v3-fp8.toml", "target.gpu=nvidia-h100-80gb-hbm3")
    assert plan.decision("triton tiles").reason == (
        f"tuned on nvidia-h100-80gb-hbm3: {path}, key {V3_KEY}"
    )
    other = plan_of("deepseek-v3-fp8.toml", "target.gpu=nvidia-l40s")
    assert other.decision("triton tiles").reason == (
        f"default table: no table of nvidia-l40s has {V3_KEY} (looked in "
        f"{tuning_dir / 'nvidia-l40s.json'})"
    )


def test_an_arch_without_a_shipped_table_needs_target_gpu(tuning_dir):
    write_user_table(tuning_dir, "nvidia-b200")
    plan = plan_of("deepseek-v3-fp8.toml", "target.arch=sm100")
    assert plan.decision("triton tiles").reason == (
        f"default table: target.gpu is unset and moec ships no table for sm100 (key {V3_KEY})"
    )
    named = plan_of("deepseek-v3-fp8.toml", "target.arch=sm100", "target.gpu=nvidia-b200")
    assert [b.block_m for b in named.tiles.buckets] == [16, 64]


def test_explain_names_the_table_it_used(tuning_dir, capsys):
    path = write_user_table(tuning_dir, "nvidia-h200")
    assert main(["explain", str(EXAMPLES / "deepseek-v3-fp8.toml"), "--tokens", "1"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "triton tiles =" in x)
    assert line.strip() == (
        f"triton tiles = 2 token buckets (T<=8, larger): tuned on nvidia-h200: {path}, key {V3_KEY}"
    )
    assert (
        main(["explain", str(EXAMPLES / "deepseek-v3-fp8.toml"), "--set", "model.hidden_size=1024"])
        == 0
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if "triton tiles =" in x)
    assert "default table: no table of nvidia-h200 has fp8_block/H1024/I2048/E256/K8" in line


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "cannot be read"),
        ("[1, 2]", "is not a JSON object of layer keys"),
        (json.dumps({V3_KEY: [{"max_tokens": None}]}), "without block_m, gate_up, down"),
        (json.dumps({V3_KEY: USER_BUCKETS[:1]}), 'without "max_tokens": null'),
    ],
)
def test_a_broken_user_table_is_a_clear_error(tuning_dir, capsys, content, says):
    (tuning_dir / "nvidia-h200.json").write_text(content)
    with pytest.raises(MoecError) as raised:
        plan_of("deepseek-v3-fp8.toml")
    assert says in raised.value.report() and "target.gpu" in raised.value.report()
    assert main(["build", str(EXAMPLES / "deepseek-v3-fp8.toml"), "-o", str(tuning_dir)]) == 2
    err = capsys.readouterr().err
    assert says in err and "moec tune" in err and "Traceback" not in err


def with_gemm(**tiles):
    """USER_BUCKETS with the first bucket's gate/up config changed (None: key removed)."""
    buckets = json.loads(json.dumps(USER_BUCKETS))
    config = buckets[0]["gate_up"]
    for name, value in tiles.items():
        config.pop(name) if value is None else config.__setitem__(name, value)
    return {V3_KEY: buckets}


def with_bucket(**fields):
    """USER_BUCKETS with fields of the first bucket changed."""
    buckets = json.loads(json.dumps(USER_BUCKETS))
    buckets[0].update(fields)
    return {V3_KEY: buckets}


def without_in_bucket(index, field):
    """USER_BUCKETS with `field` removed from one bucket."""
    buckets = json.loads(json.dumps(USER_BUCKETS))
    del buckets[index][field]
    return {V3_KEY: buckets}


def unsorted_buckets():
    """USER_BUCKETS with its first bucket twice: max_tokens not increasing."""
    buckets = json.loads(json.dumps(USER_BUCKETS))
    return {V3_KEY: [buckets[0], *buckets]}


def with_elementwise(kernel, **tiles):
    """The user table with one elementwise kernel's tiles changed (None: key removed)."""
    elementwise = json.loads(json.dumps(USER_ELEMENTWISE))
    for name, value in tiles.items():
        elementwise[kernel].pop(name) if value is None else elementwise[kernel].__setitem__(
            name, value
        )
    return {V3_KEY: USER_BUCKETS, f"elementwise/{V3_KEY}": elementwise}


@pytest.mark.parametrize(
    ("table", "says"),
    [
        (
            with_gemm(num_stages=None),
            "bucket 0 of fp8_block/H7168/I2048/E256/K8, gate_up without num_stages",
        ),
        (with_gemm(BLOCK_N=48), "gate_up with BLOCK_N = 48, not a power of two"),
        (with_gemm(BLOCK_N=2**40), "BLOCK_N = 1099511627776, not a power of two up to 65536"),
        (with_bucket(block_m=0), "bucket 0 of fp8_block/H7168/I2048/E256/K8 with block_m = 0"),
        (with_bucket(block_m=True), "with block_m = True, not the BLOCK_M both GEMMs take (16)"),
        (with_bucket(max_tokens=0), "with max_tokens = 0, not an integer above the previous"),
        (with_bucket(max_tokens=True), "with max_tokens = True, not an integer above"),
        (with_bucket(max_tokens=-1), "with max_tokens = -1"),
        (with_bucket(max_tokens=None), "with max_tokens = None, not an integer above"),
        (
            without_in_bucket(0, "max_tokens"),
            "bucket 0 of fp8_block/H7168/I2048/E256/K8 without max_tokens",
        ),
        (
            without_in_bucket(1, "max_tokens"),
            "bucket 1 of fp8_block/H7168/I2048/E256/K8 without max_tokens",
        ),
        (without_in_bucket(-1, "max_tokens"), "without max_tokens"),
        (
            with_bucket(max_tokens=64.0),
            "with max_tokens = 64.0, not an integer, or null in the last",
        ),
        (with_bucket(block_m="16"), "with block_m = '16', not an integer"),
        (with_bucket(gate_up=[16]), "with gate_up = [16], not an object of tiles"),
        ({V3_KEY: [7, *USER_BUCKETS]}, "bucket 0 of fp8_block/H7168/I2048/E256/K8 that is not an"),
        (unsorted_buckets(), "bucket 1 of fp8_block/H7168/I2048/E256/K8 with max_tokens = 8, not"),
        (with_gemm(num_warps=0), "with num_warps = 0, not a power of two"),
        (with_gemm(num_warps=65536), "with num_warps = 65536, not a power of two up to 32 (1024"),
        (with_elementwise("act", num_warps=64), "act with num_warps = 64, not a power of two up"),
        (with_gemm(num_stages="3"), "with num_stages = '3', not a positive integer"),
        (with_gemm(GROUP_SIZE_M=True), "with GROUP_SIZE_M = True, not a positive integer"),
        (with_gemm(SWAP_AB=1), "with SWAP_AB = 1, not true or false"),
        (with_gemm(BLOCK_Q=16), "with an unknown tile key 'BLOCK_Q'"),
        (with_elementwise("combine", BLOCK_T="__import__('os')"), "combine with BLOCK_T = "),
        (
            with_elementwise("act", BLOCK_I=None),
            "elementwise/fp8_block/H7168/I2048/E256/K8, act without BLOCK_I",
        ),
        (
            with_elementwise("combine", TERMS_AT_ONCE=-1),
            "TERMS_AT_ONCE = -1, not a positive integer",
        ),
        (
            {V3_KEY: USER_BUCKETS, f"elementwise/{V3_KEY}": {"act": {}}},
            "without exactly permute, act, combine",
        ),
    ],
)
def test_a_user_table_with_bad_tiles_is_a_clear_error(tuning_dir, capsys, table, says):
    """Every tile of a tuned table reaches the generated package: a wrong one is refused at
    build with the file, the entry and the value, not at the first forward."""
    (tuning_dir / "nvidia-h200.json").write_text(json.dumps(table))
    assert main(["build", str(EXAMPLES / "deepseek-v3-fp8.toml"), "-o", str(tuning_dir / "o")]) == 2
    err = capsys.readouterr().err
    assert says in err and "moec tune" in err and "Traceback" not in err
    assert not (tuning_dir / "o").exists()


def test_every_shipped_table_entry_passes_the_checks():
    """The shipped tables hold only tiles the checks accept (a build checks the key it reads)."""
    for name in SHIPPED_TABLES.values():
        entries = json.loads((TUNED_DIR / name).read_text())
        for key, entry in entries.items():
            if key.startswith("elementwise/"):
                tables._check_elementwise(entry, name, key.removeprefix("elementwise/"))
            elif not key.startswith("backends/"):
                assert tables._checked_buckets(entry, name, key) == entry


BACKENDS_KEY = f"backends/{V3_KEY}"


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ([1, 2], 'has no "source" and "ms" by backend'),
        ({"source": "s", "ms": {}}, 'has no "source" and "ms" by backend'),
        ({"source": "s", "ms": {"triton": [1.0]}}, "times of triton under"),
        ({"source": "s", "ms": {"triton": {"one": 1.0}}}, "that are not numbers"),
        ({"source": "s", "ms": {"triton": {"1": "fast"}}}, "that are not numbers"),
        ({"source": "s", "ms": {"triton": {"1": -2.0}}}, "that are not positive"),
        ({"source": "s", "ms": {"triton": {"0": 1.0}}}, "that are not positive"),
        ({"source": "s", "ms": {"triton": {"1": float("nan")}}}, "that are not positive"),
    ],
)
def test_broken_backend_times_are_a_clear_error(tuning_dir, capsys, monkeypatch, entry, says):
    """gemm_backend auto reads the layer's times per backend only where deep_gemm could run
    it; a broken entry is the table's problem, reported as such."""
    (tuning_dir / "nvidia-h200.json").write_text(json.dumps({BACKENDS_KEY: entry}))
    full = Environment(frozenset({"triton", "deep_gemm"}), tuning_dir)
    monkeypatch.setattr(Environment, "detect", classmethod(lambda cls: full))
    assert main(["build", str(EXAMPLES / "deepseek-v3-fp8.toml"), "-o", str(tuning_dir)]) == 2
    err = capsys.readouterr().err
    assert says in err and "target.gpu" in err and "Traceback" not in err
    # without deep_gemm the times are never read
    assert plan_of("deepseek-v3-fp8.toml").backends.gemm == "triton"


@pytest.mark.parametrize("tokens", [1, 5, 70])
def test_router_slices_are_what_the_kernel_makes(load_layer, tokens):
    """The plan's S (router slices, sized in the cost model) equals the kernel's partial count."""
    example = EXAMPLES / "tiny-cpu-triton.toml"
    package = load_layer(str(example))
    layer = package.MoELayer().random_(0)
    x = torch.randn(tokens, layer.gate_parts.shape[2]).bfloat16()
    # the router is fused into select: its launcher, with the tiles the stage passes it
    router = sys.modules[f"{package.__name__}.triton_router"]
    tiles = sys.modules[f"{package.__name__}.tiles"]
    partials = router.router_logits(x, layer.gate_parts, config=tiles.router(tokens))
    assert partials.shape[1:] == (tokens, layer.gate_parts.shape[1])
    assert partials.shape[0] == router_slices(make_plan(load_spec(example).spec).layer, tokens)


@pytest.mark.parametrize(
    "tokens, block_t, block_e, slices",
    [(1, 16, 32, 28), (64, 16, 32, 8), (65, 128, 64, 28), (1024, 128, 64, 4), (2048, 128, 64, 2)]
    + [(2049, 128, 128, 3), (4096, 128, 128, 2), (16384, 128, 128, 1)],
)
def test_router_tiles_per_token_bucket(tokens, block_t, block_e, slices):
    """The H200's router buckets at DeepSeek-V3 dims: decode tiles, then 64 experts wide up to
    2048 tokens (at T=1024 wider tiles need 8 slices, and the selection sums them all), then
    128 wide; the K slices follow from the grid."""
    layer = plan_of("deepseek-v3-fp8.toml").layer
    tiles = router_tiles(layer, tokens)
    assert (tiles["BLOCK_T"], tiles["BLOCK_E"]) == (block_t, block_e)
    assert router_slices(layer, tokens) == slices


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["parallel.ep_size=2"], 2 * (1 - math.prod((128 - i) / (256 - i) for i in range(8)))),
        (["parallel.ep_size=8"], 8 * (1 - math.prod((224 - i) / (256 - i) for i in range(8)))),
        (
            [
                "parallel.dispatch=deepep_low_latency",
                "parallel.max_tokens_per_rank=128",
                "target.max_num_tokens=128",
            ],
            None,
        ),
        (["parallel.ep_size=1", "parallel.dispatch=local"], None),
    ],
)
def test_received_rows_pick_the_bucket_of_tokens_per_rank(overrides, expected):
    """A rank's GEMMs run over the rows it received: their tile bucket is that of the tokens
    per rank (rows / expected rows per token), which the table of the rank's experts was tuned
    on; fixed-slot and local layers pick by their own rows."""
    plan = plan_of("deepseek-v3-ep2-all2all.toml", "experts.gemm_backend=triton", *overrides)
    got = plan.tiles.received_per_token
    if expected is None:
        assert got is None
        return
    assert got == pytest.approx(expected, abs=1e-4)
    assert any(d.what == "tile bucket of received rows" for d in plan.decisions)


def test_the_dispatch_row_copy_leaves_pdl_where_the_layer_has_it():
    """Under PDL (sm90) the plan launches the Triton dispatch's row copy in order, a decision
    with its reason; a layer without PDL has nothing to decide."""
    on_gpu = plan_of("deepseek-v3-fp8.toml")
    assert on_gpu.tiles.pdl and on_gpu.stage("dispatch").copy_pdl is False
    assert any(d.what == "dispatch row copy under PDL" for d in on_gpu.decisions)
    on_cpu = plan_of("tiny-cpu-triton.toml")
    assert not on_cpu.tiles.pdl and on_cpu.stage("dispatch").copy_pdl is True
    assert not any(d.what == "dispatch row copy under PDL" for d in on_cpu.decisions)


def test_a_user_table_writing_a_key_twice_is_refused(tuning_dir):
    # json.loads would keep the second of the two silently: which tiles were meant is unknown
    table = json.dumps({V3_KEY: USER_BUCKETS, f"elementwise/{V3_KEY}": USER_ELEMENTWISE})
    twice = "{" + table[1:-1] + ", " + json.dumps(V3_KEY) + ": []}"
    (tuning_dir / "nvidia-h200.json").write_text(twice)
    with pytest.raises(MoecError) as raised:
        plan_of("deepseek-v3-fp8.toml")
    message = str(raised.value)
    assert "nvidia-h200.json" in message
    assert f'the key "{V3_KEY}" is written twice' in message


def test_one_environment_reads_a_users_table_once(tmp_path, monkeypatch):
    # a plan with a GEMM split looks its tables up for each side and stage: one read, one content
    write_user_table(tmp_path, "nvidia-h200")
    env = Environment(frozenset({"triton", "deep_gemm"}), tmp_path)
    reads = []
    real = environment.read_table
    monkeypatch.setattr(environment, "read_table", lambda *a: reads.append(a) or real(*a))
    spec = load_spec(EXAMPLES / "deepseek-v3-fp8.toml", ["experts.gemm_backend=auto"]).spec
    make_plan(spec, env)
    make_plan(spec, env)
    assert len(reads) == 1
    assert env.tables("nvidia-h200") is env.tables("nvidia-h200")
