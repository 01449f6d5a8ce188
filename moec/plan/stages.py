"""Stage records: one typed record per stage kind, holding every decision its renderer needs.

    [Router] -> [Select] -> [Quantize] -> [Dispatch] -> [Gemm gate_up] -> [Activation]
                   |                                                          |
                   +--------------------------> [Combine] <- [Gemm down] <---+
                                                    |
                            [SharedExpert] --> [Finalize] -> output

Every record has the fields of `Stage` (name, backend, the tensors it writes, the types it
accepts, the weights it reads) and the fields of its kind. Records are frozen: a pass that
changes a stage builds a new record (`dataclasses.replace`) and puts it in the plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import ClassVar, Literal

from moec.plan.deepep import DeepEPBuffer
from moec.plan.layer import QuantFormat
from moec.plan.types import TensorType
from moec.vocab import (
    ActivationKind,
    Backend,
    ConvertStep,
    DispatchMode,
    GemmLayout,
    GemmRole,
    ReplicaChoice,
    RouterPrecision,
    RouterRounding,
    ScoringFunc,
    StageKind,
    TopkMethod,
    TorchKernel,
)


@dataclass(frozen=True, kw_only=True)
class Stage:
    """What every stage has."""

    kind: ClassVar[StageKind]
    name: str
    backend: Backend
    """Who runs it: torch, triton, torch.distributed, deep_gemm, deep_ep ("-" for input/output)."""
    outputs: dict[str, TensorType] = field(default_factory=dict)
    """Tensors this stage produces, by variable name."""
    accepts: dict[str, TensorType] = field(default_factory=dict)
    """Type this stage needs on each input (by input name); absent = takes what it gets."""
    weights: dict[str, TensorType] = field(default_factory=dict)
    """Parameters of the layer this stage reads, by attribute name."""
    scratch: dict[str, TensorType] = field(default_factory=dict)
    """Tensors its kernels write and read back within the stage (a fused stage's former edges
    that still pass through memory), by name: the cost model counts them."""
    workspace: dict[str, TensorType] = field(default_factory=dict)
    """Buffers of the layer its kernels keep between calls, by attribute name: zeros when the
    layer is made (or a table's values), in no checkpoint; which ones every call leaves zero,
    zeroed_workspace says."""
    fused: tuple[StageKind, ...] = ()
    """Stage kinds folded into this one by the fuse pass."""
    syncs_host: bool = False
    graph_safe: bool = True
    side_stream: bool = False
    """Runs on a second CUDA stream from the start of the forward; its consumer waits for it."""
    note: str = ""
    origin: tuple[str, ...] = ()
    """Spec keys whose values led to this stage and its backend (for messages)."""

    def zeroed_workspace(self) -> tuple[str, ...]:
        """The workspace its kernels leave zero after every call: zeroed again when the layer's
        weights are set, whatever an interrupted call left there."""
        return tuple(self.workspace)


@dataclass(frozen=True, kw_only=True)
class Input(Stage):
    kind: ClassVar[StageKind] = StageKind.input


@dataclass(frozen=True, kw_only=True)
class Output(Stage):
    kind: ClassVar[StageKind] = StageKind.output


@dataclass(frozen=True, kw_only=True)
class Router(Stage):
    """Router logits [T, E] in fp32."""

    kind: ClassVar[StageKind] = StageKind.router
    experts: int
    precision: RouterPrecision = RouterPrecision.fp32
    """fp32: one fp32 GEMM; bf16x3: the fp32 weight as three bf16 parts on bf16 tensor cores."""


@dataclass(frozen=True, kw_only=True)
class Select(Stage):
    """Scores, top-k choice and weights of each token."""

    kind: ClassVar[StageKind] = StageKind.select
    scoring_func: ScoringFunc
    topk_method: TopkMethod
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    top_k: int
    experts: int
    routed_scaling_factor: float = 1.0
    """Folded into the weights by the fuse pass (1.0 until then)."""
    fused_shared: int = 0
    """Shared experts appended to every token's choice with weight 1."""
    one_launch: int = 0
    """With the (bf16x3 Triton) router fused in: the most tokens whose router logits and
    selection are one launch; 0: the router is a stage of its own."""
    rounding: RouterRounding = RouterRounding.none
    """What the selection rounds to the layer's dtype (router.rounding; none in an fp32
    layer)."""

    @property
    def has_bias(self) -> bool:
        return "gate_bias" in self.weights


@dataclass(frozen=True, kw_only=True)
class Place(Stage):
    """Logical expert ids to physical ones (a replica of each), and the load record."""

    kind: ClassVar[StageKind] = StageKind.place
    experts: int
    """Logical routed experts."""
    physical: int
    """Physical experts of all ranks."""
    top_k: int
    mapped: bool
    """The ids change (replicas, or a placement of its own); else the stage only records."""
    replica_choice: ReplicaChoice
    """static (each rank's fixed replica per expert) or random (a hash of the position)."""
    record_load: bool
    tables: tuple[tuple[str, tuple[int, ...] | tuple[tuple[int, ...], ...]], ...] = ()
    """Workspace buffers filled with these values when the layer is made, by name."""
    rank_tables: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = ()
    """Workspace buffers filled with their rank's row of these values."""

    def zeroed_workspace(self) -> tuple[str, ...]:
        """None: its tables hold constants, and its load record counts across calls."""
        return ()


@dataclass(frozen=True, kw_only=True)
class Quantize(Stage):
    """Activation quantization for the expert GEMMs."""

    kind: ClassVar[StageKind] = StageKind.quantize
    format: QuantFormat


@dataclass(frozen=True, kw_only=True)
class Dispatch(Stage):
    """Tokens to the grouped layout: a local permute, or an exchange between ranks first."""

    kind: ClassVar[StageKind] = StageKind.dispatch
    mode: DispatchMode
    layout: GemmLayout
    experts: int
    """Experts of the grouped layout on this rank (fused shared ones included)."""
    row_padding: int | None
    """Contiguous rows per expert padded to this; None: the Triton tile's BLOCK_M per bucket."""
    routing_backend: Backend
    """Who computes the layout's indices: torch or triton."""
    route_one_pass: int = 0
    """Triton routing: the most assignments whose layout indices are one launch (every program
    counts all of them itself; above, two launches count the parts first); 0: torch routes."""
    quantize: QuantFormat | None = None
    """Quantization fused into the copy (the fuse pass), or None."""
    mn_major_scales: bool = False
    """The fused quantization writes its scales MN-major, TMA-aligned (what DeepGEMM reads)."""
    buffer: DeepEPBuffer | None = None
    """DeepEP modes: the buffer each rank allocates for dispatch and combine."""
    one_launch: int = 0
    """Assignments up to which a Triton dispatch writes the indices and the rows in one launch
    (contiguous, local); 0: never."""
    copy_pdl: bool = True
    """Whether a Triton dispatch's row copy after the route takes part in programmatic dependent
    launch, where the layer launches with it (the tile pass decides)."""
    gather: bool = False
    """No row copy: the tokens stay in token order (quantized once each) and the gate/up GEMM
    reads each layout row's token through the routing's token_of_row (the gather pass)."""


@dataclass(frozen=True, kw_only=True)
class Gemm(Stage):
    """One grouped GEMM of the routed experts: [rows, k] x [E, n, k] -> [rows, n]."""

    kind: ClassVar[StageKind] = StageKind.gemm
    role: GemmRole
    format: QuantFormat
    layout: GemmLayout
    n: str
    k: str
    n_value: int
    k_value: int
    torch_kernel: TorchKernel | None = None
    """The torch backend's way (None for other backends)."""
    gather: bool = False
    """A is the tokens' rows [T, k], each layout row reading its token's (Dispatch.gather)."""
    psum_from: int | None = None
    """contiguous, DeepGEMM: from this many tokens on, the layout is told by each expert's end
    row (routing.ends, its psum form), below by each row's expert (routing.m_indices); None:
    m_indices only (other backends, the masked layout)."""
    psum_branch: bool = False
    """Whether the stage branches on T at psum_from (its plan's token range starts below it);
    False: one form for every T the stage sees."""

    @property
    def weight(self) -> str:
        return "w13" if self.role == GemmRole.gate_up else "w2"


@dataclass(frozen=True, kw_only=True)
class Activation(Stage):
    """The gated activation of the gate/up output, [rows, 2I] -> [rows, I]."""

    kind: ClassVar[StageKind] = StageKind.activation
    activation: ActivationKind
    values: tuple[tuple[str, float], ...]
    layout: GemmLayout
    intermediate: int
    quantize: QuantFormat | None = None
    """Quantization of the output for the down GEMM, fused in (the fuse pass), or None."""
    mn_major_scales: bool = False
    """The fused quantization writes its scales MN-major, TMA-aligned (what DeepGEMM reads)."""


@dataclass(frozen=True, kw_only=True)
class Combine(Stage):
    """Weighted sum of each token's expert rows (after the return exchange, with EP)."""

    kind: ClassVar[StageKind] = StageKind.combine
    mode: DispatchMode
    layout: GemmLayout
    add_shared: bool = False
    reduce_backend: Backend | Literal[""] = ""
    """all2all and deepep_normal: who weights and sums each received row's expert outputs on
    the expert rank (and, all2all, each token's returned partials): torch or triton; "" for
    the other modes."""


@dataclass(frozen=True, kw_only=True)
class SharedExpert(Stage):
    """The shared experts: one dense gated MLP beside the routed experts."""

    kind: ClassVar[StageKind] = StageKind.shared_expert
    format: QuantFormat
    experts: int
    intermediate: int
    activation: ActivationKind
    values: tuple[tuple[str, float], ...]


@dataclass(frozen=True, kw_only=True)
class Finalize(Stage):
    """Routed scaling, the shared output, the tensor-parallel all-reduce."""

    kind: ClassVar[StageKind] = StageKind.finalize
    routed_scaling_factor: float
    add_shared: bool
    all_reduce: bool


@dataclass(frozen=True, kw_only=True)
class Convert(Stage):
    """A scale-layout converter inserted by the convert pass."""

    kind: ClassVar[StageKind] = StageKind.convert
    steps: tuple[ConvertStep, ...]


def choices(stage: Stage) -> dict[str, object]:
    """The kind's own fields of a stage, as plain data (for explain and plan.json)."""
    common = {f for f in Stage.__dataclass_fields__}
    data: dict[str, object] = {}
    for name in stage.__dataclass_fields__:
        if name in common:
            continue
        value = getattr(stage, name)
        if isinstance(value, QuantFormat):
            value = value.scheme
        elif isinstance(value, DeepEPBuffer):
            value = asdict(value)
        elif isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        data[name] = value
    return data
