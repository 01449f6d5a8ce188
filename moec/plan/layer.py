"""The layer as one rank runs it: sizes, number formats and target, derived once from the spec.

Per-rank sizes (TP slices the intermediate, EP splits the experts), the quantization formats of
the routed and shared experts, and the dtypes. Nothing here is a choice; choices are passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from moec.plan.types import DType, ScaleType
from moec.spec import placement
from moec.spec.models import Spec
from moec.spec.normalize import scheme_defaults
from moec.vocab import (
    ActivationKind,
    ActivationScheme,
    Arch,
    CheckpointFormat,
    DeviceKind,
    DispatchMode,
    ReplicaChoice,
    ScaleDtype,
    ScaleMajor,
    Scheme,
    SharedExperts,
    TopkMethod,
)


@dataclass(frozen=True)
class QuantFormat:
    """How one set of experts (routed or shared) stores weights and quantizes activations."""

    scheme: Scheme
    weight_block: tuple[int, int] | None
    """[block_n, block_k] of the weight scales; None for bf16 / per-tensor."""
    group: int | None
    """Activation quantization group along K (1 x group); None: no groups."""
    pow2_scales: bool
    """Scales are powers of two (UE8M0)."""
    static: bool = False
    """Activation scales are fixed, from the checkpoint's `input_scale` (fp8_per_tensor only)."""
    checkpoint_quantized: bool = False
    """The checkpoint holds this format's values and `weight_scale_inv` (else it is quantized on
    load from float weights)."""
    source: Scheme | None = None
    """"mxfp4": mxfp4 weights (the checkpoint's, or floats quantized to mxfp4) stored in this
    fp8_block format, converted exactly at load."""

    @property
    def quantized(self) -> bool:
        return self.scheme != Scheme.bf16

    @property
    def weight_dtype(self) -> DType:
        return {Scheme.bf16: DType.bfloat16, Scheme.mxfp4: DType.e2m1x2}.get(
            self.scheme, DType.e4m3
        )

    @property
    def weight_bytes_per_value(self) -> float:
        return 0.5 if self.scheme == Scheme.mxfp4 else self.weight_dtype.bytes

    def activation_scale(self) -> ScaleType | None:
        """Scale type of activations quantized for this format's GEMMs (as produced)."""
        if not self.quantized:
            return None
        if self.group is None:
            return ScaleType("per-tensor", DType.float32)
        return ScaleType(f"1x{self.group}", DType.float32, ScaleMajor.K, False, self.pow2_scales)

    def weight_scale_granularity(self) -> str:
        if self.scheme == Scheme.fp8_per_tensor:
            return "per-expert"
        assert self.weight_block is not None
        return f"{self.weight_block[0]}x{self.weight_block[1]}"

    def label(self) -> str:
        if not self.quantized:
            return "bf16"
        source = f", from {self.source} at load" if self.source else ""
        return f"{self.scheme} (weights {self.weight_scale_granularity()}{source}, activations " + (
            f"1x{self.group})" if self.group else "per-tensor)"
        )

    def as_e4m3_blocks(self) -> QuantFormat:
        """This mxfp4 format stored as fp8_block (128 x 128 weight blocks, 1 x 128 fp32
        activation scales), its values unchanged (runtime quant.e2m1_to_e4m3_blocks)."""
        return QuantFormat(
            Scheme.fp8_block, (128, 128), 128, False, False, self.checkpoint_quantized, Scheme.mxfp4
        )


def quant_format(name: str, spec: Spec) -> QuantFormat:
    """Format of scheme `name` under `spec` (the spec's own keys apply to its routed scheme)."""
    quant, scheme = spec.quant, Scheme(name)
    own = scheme == quant.scheme
    checkpoint = scheme != Scheme.bf16 and quant.checkpoint == CheckpointFormat.quantized
    if scheme in (Scheme.bf16, Scheme.fp8_per_tensor):
        static = (
            scheme == Scheme.fp8_per_tensor and quant.activation_scheme == ActivationScheme.static
        )
        return QuantFormat(scheme, None, None, False, static, checkpoint)
    # the routed scheme's keys, filled by normalize; the shared scheme's defaults (no keys)
    default_block, default_scale = scheme_defaults(scheme)
    block = quant.weight_block if own else default_block
    scale_dtype = quant.scale_dtype if own else default_scale
    assert block is not None and scale_dtype is not None, "quant_format of a normalized spec"
    return QuantFormat(
        scheme, (block[0], block[1]), block[1], scale_dtype == ScaleDtype.ue8m0, False, checkpoint
    )


@dataclass(frozen=True)
class Layer:
    """Sizes and formats of one rank's layer; every pass reads these, none changes them."""

    name: str
    dtype: DType
    hidden: int
    intermediate: int
    """Per-rank intermediate of one routed expert."""
    shared_intermediate: int
    """Per-rank intermediate of the shared experts together (0 = none)."""
    n_shared: int
    routed_experts: int
    """All routed experts of the model."""
    local_experts: int
    """Routed (physical) experts on this rank."""
    placement: tuple[tuple[int, ...], ...]
    """The logical expert of each rank's physical experts (parallel.placement), rank by rank."""
    replica_choice: ReplicaChoice
    """static or random (parallel.replica_choice)."""
    record_load: bool
    """The layer counts the tokens of each logical expert (parallel.record_load)."""
    top_k: int
    routed: QuantFormat
    shared: QuantFormat
    fused_shared: bool
    shared_overlap: bool
    """The (separate) shared experts run on a second CUDA stream (experts.shared_experts)."""
    tp: int
    ep: int
    nodes: int
    """Nodes the tp * ep ranks span, evenly."""
    dispatch: DispatchMode
    tokens_per_rank: int | None
    """parallel.max_tokens_per_rank: the bound DeepEP's low-latency buffers are sized for."""
    device: DeviceKind
    arch: Arch | None
    gpu: str | None
    """The GPU whose tuned tiles the spec asks for (target.gpu), if it names one."""
    max_tokens: int
    activation: ActivationKind
    """Gated activation kind (moec/plan/activations.py)."""
    activation_values: tuple[tuple[str, float], ...]
    """Its parameters, (name, value) in the spec's order."""
    vocab: int = 0
    """Token ids of the hash table (router.topk_method = "hash"), else 0."""

    @property
    def hashed(self) -> bool:
        """The experts come from the hash table of token ids (the forward takes them)."""
        return self.vocab > 0

    @property
    def exchanges_rows(self) -> bool:
        """The dispatch sends token rows to the ranks of their experts and the GEMMs run over
        the rows a rank received (all2all, DeepEP normal); low latency uses fixed slots."""
        return self.dispatch in (DispatchMode.all2all, DispatchMode.deepep_normal)

    @property
    def physical_experts(self) -> int:
        """Routed experts of all ranks, replicas included."""
        return self.local_experts * self.ep

    @property
    def placed(self) -> bool:
        """Physical experts differ from the logical ones: the dispatch maps ids after select."""
        return [e for rank in self.placement for e in rank] != list(range(self.routed_experts))

    @property
    def grouped_experts(self) -> int:
        """Experts of the grouped GEMM: the local routed ones plus fused shared experts."""
        return self.local_experts + (self.n_shared if self.fused_shared else 0)

    @property
    def grouped_top_k(self) -> int:
        """Rows each token contributes to the grouped GEMM."""
        return self.top_k + (self.n_shared if self.fused_shared else 0)


def layer_of(spec: Spec) -> Layer:
    """The layer of a normalized spec, as one rank runs it."""
    model, parallel = spec.model, spec.parallel
    fused = (
        spec.experts.shared_experts == SharedExperts.fused and model.n_shared_experts > 0
    )  # auto: resolve
    return Layer(
        name=spec.name,
        dtype=DType(spec.target.dtype),
        hidden=model.hidden_size,
        intermediate=model.moe_intermediate_size // parallel.tp_size,
        shared_intermediate=model.moe_intermediate_size
        * model.n_shared_experts
        // parallel.tp_size,
        n_shared=model.n_shared_experts,
        routed_experts=model.n_routed_experts,
        local_experts=(model.n_routed_experts + parallel.redundant_experts) // parallel.ep_size,
        placement=tuple(tuple(rank) for rank in placement.of(parallel, model.n_routed_experts)),
        replica_choice=ReplicaChoice(parallel.replica_choice),
        record_load=parallel.record_load,
        top_k=model.num_experts_per_tok,
        routed=quant_format(spec.quant.scheme, spec),
        shared=quant_format(spec.quant.shared_scheme or spec.quant.scheme, spec),
        fused_shared=fused,
        shared_overlap=spec.experts.shared_experts == SharedExperts.overlapped,
        tp=parallel.tp_size,
        ep=parallel.ep_size,
        nodes=parallel.nodes,
        dispatch=DispatchMode(parallel.dispatch),
        tokens_per_rank=parallel.max_tokens_per_rank,
        device=DeviceKind(spec.target.device),
        arch=Arch(spec.target.arch) if spec.target.arch else None,
        gpu=spec.target.gpu,
        max_tokens=spec.target.max_num_tokens,
        activation=ActivationKind(spec.activation.kind),
        activation_values=tuple(
            (key, value) for key, value in spec.activation.model_dump().items() if key != "kind"
        ),
        vocab=(model.vocab_size or 0) if spec.router.topk_method == TopkMethod.hash else 0,
    )
