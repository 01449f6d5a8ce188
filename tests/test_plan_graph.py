"""The plan as a graph: stage nodes with backend and params, edges typed with dtype, symbolic
shape, layout and scale type (granularity, scale dtype, major-ness, TMA alignment).

Every example is planned twice, as if deep_gemm / deep_ep were not installed and as if they
were (`Environment`), so the tests do not depend on this machine.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import networkx as nx
import pytest

from moec.plan import Environment, Plan, Stage, make_plan
from moec.plan.backends import accepted_scale
from moec.plan.graph import STAGE_ORDER
from moec.plan.stages import Dispatch, Gemm
from moec.plan.types import DType, Layout, ScaleType, TensorType
from moec.spec import load_spec
from moec.vocab import StrEnum

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.toml"))
PLAIN = Environment(frozenset({"triton"}))
FULL = Environment(frozenset({"triton", "deep_gemm", "deep_ep"}))

_CACHE: dict[tuple[str, tuple[str, ...], Environment], Plan] = {}


def plan_of(name: str, *overrides: str, env: Environment = PLAIN) -> Plan:
    key = (name, overrides, env)
    if key not in _CACHE:
        _CACHE[key] = make_plan(load_spec(EXAMPLES / name, list(overrides)).spec, env)
    return _CACHE[key]


ALL_PLANS = [
    pytest.param(path.name, env, id=f"{path.stem}-{label}")
    for path in EXAMPLE_FILES
    for env, label in ((PLAIN, "plain"), (FULL, "deep_gemm"))
]


def test_examples_exist():
    assert len(EXAMPLE_FILES) >= 10


@pytest.mark.parametrize(("name", "env"), ALL_PLANS)
def test_plan_is_a_dag_from_input_to_output(name, env):
    plan = plan_of(name, env=env)
    graph = plan.graph
    assert isinstance(graph, nx.DiGraph)
    assert nx.is_directed_acyclic_graph(graph)
    assert [n for n in graph if graph.in_degree(n) == 0] == ["input"]
    assert [n for n in graph if graph.out_degree(n) == 0] == ["output"]
    # every stage is on a path from input to output
    for name_ in graph:
        assert nx.has_path(graph, "input", name_) and nx.has_path(graph, name_, "output")


@pytest.mark.parametrize(("name", "env"), ALL_PLANS)
def test_every_node_is_a_typed_stage_with_backend(name, env):
    plan = plan_of(name, env=env)
    for node, data in plan.graph.nodes(data=True):
        stage = data["stage"]
        assert stage.name == node
        assert stage.kind in STAGE_ORDER or stage.kind in ("gemm", "convert")
        assert isinstance(stage.backend, str) and stage.backend
        assert isinstance(stage, Stage) and type(stage).kind == stage.kind
        if stage.kind not in ("input", "output"):
            assert stage.backend in (
                "torch",
                "triton",
                "deep_gemm",
                "deep_ep",
                "torch.distributed",
            )
        for tensor_type in (*stage.outputs.values(), *stage.weights.values()):
            assert isinstance(tensor_type, TensorType)


@pytest.mark.parametrize(("name", "env"), ALL_PLANS)
def test_every_edge_is_typed_with_what_the_producer_writes(name, env):
    plan = plan_of(name, env=env)
    for producer, consumer, data in plan.graph.edges(data=True):
        assert data["tensors"], f"{producer} -> {consumer} carries nothing"
        for edge in data["tensors"]:
            assert isinstance(edge.type, TensorType)
            assert isinstance(edge.type.dtype, DType)
            assert isinstance(edge.type.layout, Layout)
            assert edge.type.shape and all(isinstance(d, str) for d in edge.type.shape)
            # the edge's type is exactly the producer's output: nothing changes on the way
            assert plan.stage(producer).outputs[edge.tensor] == edge.type
            if edge.type.dtype is DType.e4m3:
                assert edge.type.scale is not None, f"{edge.tensor}: fp8 without scales"
            if edge.type.dtype in (DType.bfloat16, DType.float32, DType.int32):
                assert edge.type.scale is None


@pytest.mark.parametrize(("name", "env"), ALL_PLANS)
def test_every_consumer_gets_the_type_it_accepts(name, env):
    """After the convert pass no edge differs from its consumer's declared input type."""
    plan = plan_of(name, env=env)
    for stage in plan.order():
        for _, edge in plan.inputs(stage.name):
            wanted = stage.accepts.get(edge.input)
            if wanted is not None:
                assert edge.type == wanted, (stage.name, edge.input)


@pytest.mark.parametrize(("name", "env"), ALL_PLANS)
def test_every_output_is_consumed(name, env):
    plan = plan_of(name, env=env)
    for stage in plan.order():
        consumed = {edge.tensor for _, edge in plan.consumers(stage.name)}
        assert set(stage.outputs) == consumed, stage.name


def test_grouped_layout_types_of_the_deepseek_v3_fp8_plan():
    plan = plan_of("deepseek-v3-fp8.toml")
    assert plan.backends.layout == "contiguous"
    # the tokens' rows, quantized once each: the gate/up GEMM gathers them (copy-free dispatch)
    a = plan.stage("dispatch").outputs["a"]
    assert a.dtype is DType.e4m3
    assert a.shape == ("T", "H")
    assert a.layout is Layout.row_major
    assert a.scale == ScaleType("1x128", DType.float32, "K", False, False)
    assert plan.stage("gemm_gate_up").accepts["a"] == a
    assert plan.stage("dispatch").outputs["routing"] == TensorType(
        DType.int32, ("M",), Layout.contiguous, record="ContiguousRouting"
    )
    h = plan.stage("gemm_gate_up").outputs["h"]
    assert (h.dtype, h.shape, h.layout, h.scale) == (
        DType.bfloat16,
        ("M", "2I"),
        Layout.contiguous,
        None,
    )
    weights = plan.stage("gemm_gate_up").weights
    assert weights["w13"] == TensorType(DType.e4m3, ("E", "2I", "H"))
    assert weights["w13_scale"] == TensorType(DType.float32, ("E", "2I/128", "H/128"))
    # the Triton router, fused into select: its partial logits of S hidden-dim slices pass
    # through memory within the stage; the layer keeps one arrival counter per token
    select = plan.stage("select")
    assert "router" in select.fused and select.one_launch == 1
    assert select.scratch == {"logits": TensorType(DType.float32, ("S", "T", "E"))}
    assert select.workspace == {"gate_counters": TensorType(DType.int32, ("1",))}
    assert list(select.weights) == ["gate_parts", "gate_bias"]
    assert select.outputs["topk_ids"] == TensorType(DType.int32, ("T", "K"))


def test_masked_layout_types():
    plan = plan_of("deepseek-v3-deepep-ll-ep8.toml")
    assert plan.backends.layout == "masked"
    a = plan.stage("dispatch").outputs["a"]
    assert a.shape == ("E", "max_m", "H") and a.layout is Layout.masked
    assert plan.stage("dispatch").outputs["routing"].shape == ("E",)
    assert plan.stage("gemm_down").outputs["y"].shape == ("E", "max_m", "H")


def test_scale_types_of_deep_gemm_inputs_sm90_and_sm100():
    sm90 = plan_of("deepseek-v3-fp8.toml", 'experts.gemm_backend="deep_gemm"', env=FULL)
    accepted = sm90.stage("gemm_gate_up").accepts["a"].scale
    assert accepted == ScaleType("1x128", DType.float32, "MN", True, False)
    # sm100 (what DeepGEMM's Blackwell kernels read; moec does not drive them yet)
    produced = ScaleType("1x32", DType.float32, "K", False, True)
    accepted = accepted_scale("deep_gemm", "sm100", produced)
    assert accepted.granularity == "1x32"
    assert accepted.dtype is DType.ue8m0x4
    assert (accepted.major, accepted.tma_aligned, accepted.pow2_scales) == ("MN", True, True)


def test_scale_dtype_ue8m0_packed_is_four_per_int32():
    assert DType.ue8m0x4.bytes == 4
    assert DType.ue8m0x4.torch == "int32"
    assert DType.ue8m0.bytes == 1
    packed = ScaleType("1x32", DType.ue8m0x4, "MN", True, True)
    assert packed.label() == "1x32 ue8m0x4(int32) MN-major TMA-aligned"
    pow2 = ScaleType("1x128", DType.float32, "K", False, True)
    assert pow2.label() == "1x128 fp32 pow2 K-major"


def test_tensor_type_label_and_dict():
    scale = ScaleType("1x128", DType.float32, "MN", True)
    tensor = TensorType(DType.e4m3, ("E", "max_m", "H"), Layout.masked, scale)
    assert (
        tensor.label()
        == "e4m3[E, max_m, H] masked-grouped + scale(1x128 fp32 MN-major TMA-aligned)"
    )
    assert tensor.as_dict() == {
        "dtype": "e4m3",
        "shape": ["E", "max_m", "H"],
        "layout": "masked-grouped",
        "scale": {
            "granularity": "1x128",
            "dtype": "float32",
            "major": "MN",
            "tma_aligned": True,
            "pow2_scales": False,
        },
    }
    assert "scale" not in TensorType(DType.bfloat16, ("T", "H")).as_dict()
    assert TensorType(DType.bfloat16, ("T", "H")).label() == "bf16[T, H]"


def test_per_tensor_scale_type():
    plan = plan_of("deepseek-v3-fp8.toml", 'quant.scheme="fp8_per_tensor"')
    a = plan.stage("dispatch").outputs["a"]
    assert a.dtype is DType.e4m3
    assert a.scale == ScaleType("per-tensor", DType.float32)
    assert plan.stage("gemm_gate_up").weights["w13_scale"] == TensorType(DType.float32, ("E", "1"))


def test_order_is_the_lexicographic_topological_sort():
    plan = plan_of("deepseek-v3-fp8.toml", env=FULL)
    names = [s.name for s in plan.order()]
    assert len(names) == len(plan.graph)
    position = {n: i for i, n in enumerate(names)}
    for producer, consumer in plan.graph.edges:
        assert position[producer] < position[consumer]
    rank = {kind: i for i, kind in enumerate(STAGE_ORDER)}

    def key(name):
        return f"{rank.get(plan.stage(name).kind, len(rank)):02d}:{name}"

    assert names == list(nx.lexicographical_topological_sort(plan.graph, key=key))


def test_order_does_not_depend_on_insertion_order():
    plan = plan_of("deepseek-v3-fp8.toml", env=FULL)
    shuffled = nx.DiGraph()
    for node in reversed(list(plan.graph.nodes)):
        shuffled.add_node(node, **plan.graph.nodes[node])
    for producer, consumer in reversed(list(plan.graph.edges)):
        shuffled.add_edge(producer, consumer, **plan.graph.edges[producer, consumer])
    other = Plan(plan.name, plan.spec_hash, plan.layer, plan.backends, graph=shuffled)
    assert [s.name for s in other.order()] == [s.name for s in plan.order()]
    for stage in plan.order():
        assert other.inputs(stage.name) == plan.inputs(stage.name)
        assert other.consumers(stage.name) == plan.consumers(stage.name)


def test_order_tie_break_follows_stage_order_for_gemm_stages():
    plan = plan_of("deepseek-v3-fp8.toml", "experts.shared_experts=separate")
    names = [s.name for s in plan.order()]
    # shared_expert only has to precede combine; STAGE_ORDER puts it after the expert GEMMs
    assert names.index("gemm_down") < names.index("shared_expert")


def test_the_route_threshold_the_plan_states_is_the_one_the_kernels_get():
    """One owner: the plan's one-launch bound of the Triton route is passed by the generated
    call (the runtime has no default of its own), and the torch route has none."""
    import inspect

    from moec.codegen import render_package
    from moec.plan.build import ONE_LAUNCH_ROUTE
    from moec.runtime import triton_route
    from moec.spec import load_spec

    for function in (triton_route.route_layout, triton_route.route_contiguous):
        assert inspect.signature(function).parameters["one_pass"].default is inspect.Parameter.empty
    triton = plan_of("tiny-cpu-triton.toml")
    assert triton.stage("dispatch", Dispatch).route_one_pass == ONE_LAUNCH_ROUTE
    stages = render_package(load_spec(EXAMPLES / "tiny-cpu-triton.toml"), PLAIN)["stages.py"]
    assert f"route_one_pass={ONE_LAUNCH_ROUTE}," in stages.decode()
    assert plan_of("tiny-cpu.toml").stage("dispatch", Dispatch).route_one_pass == 0


def _vocabulary_fields(record) -> dict[str, tuple[type, ...]]:
    """The fields of a record typed with vocabulary enums (moec/vocab.py) or tuples of them, and
    those enums."""
    found = {}
    for name, hint in typing.get_type_hints(type(record)).items():
        options = typing.get_args(hint) or (hint,)
        enums = tuple(o for o in options if isinstance(o, type) and issubclass(o, StrEnum))
        if enums and name in {f.name for f in dataclasses.fields(record)}:
            found[name] = enums
    return found


@pytest.mark.parametrize("name, env", ALL_PLANS)
def test_records_hold_vocabulary_members(name, env):
    """A field typed with a vocabulary enum holds a member, not the string the spec had: the
    passes compare members, and a name never changes on the way."""
    plan = plan_of(name, env=env)
    records = [plan.layer, plan.layer.routed, plan.layer.shared, plan.backends, *plan.order()]
    for record in records:
        for field, enums in _vocabulary_fields(record).items():
            value = getattr(record, field)
            values = value if isinstance(value, tuple) else (value,)  # tuple[Enum, ...] fields
            for one in values:
                assert one in (None, "") or isinstance(one, enums), (record, field, one)
    for stage in plan.order():
        assert plan.stage(stage.name, type(stage)) is stage


def test_stage_of_another_kind_is_refused():
    plan = plan_of("deepseek-v3-fp8.toml")
    assert isinstance(plan.stage("dispatch", Dispatch), Dispatch)
    with pytest.raises(TypeError, match="stage dispatch is a Dispatch, not a Gemm"):
        plan.stage("dispatch", Gemm)


def _broken_copies():
    """A finished plan, broken in each way Plan.verify knows, with what it must say."""
    import copy

    from moec.plan.types import DType

    def fresh():
        return copy.deepcopy(plan_of("deepseek-v3-fp8.toml"))

    cycle = fresh()
    cycle.graph.add_edge("output", "input", tensors=[])
    yield cycle, "the stage graph has a cycle"
    dead = fresh()
    dead.add_stage(dataclasses.replace(dead.stage("combine"), name="combine_again"))
    dead.graph.add_edge("input", "combine_again", tensors=[])
    yield dead, "nothing reads the outputs of combine_again"
    retyped = fresh()
    producer, edge = retyped.inputs("combine")[0]
    retyped.update(producer, outputs={**retyped.stage(producer).outputs, edge.tensor: None})
    yield retyped, f"{producer} -> combine carries {edge.tensor}"
    accepts = fresh()
    gemm = accepts.stage("gemm_gate_up")
    wrong = dataclasses.replace(gemm.accepts["a"], dtype=DType.bfloat16)
    accepts.update("gemm_gate_up", accepts={**gemm.accepts, "a": wrong})
    yield accepts, "gemm_gate_up takes a as"


@pytest.mark.parametrize("index", range(4))
def test_verify_names_the_pass_that_broke_the_plan(index):
    """Plan.verify runs after every pass (make_plan); each invariant it checks fires."""
    plan_of("deepseek-v3-fp8.toml").verify("a finished plan", converted=True)
    plan, says = list(_broken_copies())[index]
    with pytest.raises(AssertionError, match=f"moec bug: after some pass, {says}"):
        plan.verify("some pass", converted=True)
