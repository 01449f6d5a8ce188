"""The weights of one MoE layer: load them from an HF / DeepSeek checkpoint, or draw random ones.

Checkpoint names, after the caller's prefix (e.g. "model.layers.3.mlp."):

    gate.weight [E, H], gate.e_score_correction_bias [E] (noaux_tc routers)
    experts.{e}.{gate,up,down}_proj.weight (+ .weight_scale_inv, + .input_scale when static)
    experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I] (transformers, in memory)
    shared_experts.{gate,up,down}_proj.weight (+ .weight_scale_inv, .input_scale)

or DeepSeek's own names, as the DeepSeek-V4 checkpoints store them (prefix "layers.3.ffn."):
gate.bias for the correction bias, experts.{e}.{w1,w3,w2}.weight (gate, up, down) with .scale,
shared_experts.{w1,w3,w2}.weight (+ .scale). A hash router's table: gate.tid2eid [V, K], the
experts of each token id. Other DeepSeek-style checkpoints name the router and its bias
otherwise: router.gate.weight and expert_bias (AFMoE), gate.expert_bias (Ling, Sarvam-MoE), the
bias beside the gate as e_score_correction_bias (EXAONE-MoE, MiniMax-M2, LFM2-MoE); Hunyuan's
router gate.wg.weight and its shared expert shared_mlp.{gate,up,down}_proj.weight; Granite's
router.weight (router.layer.weight in its checkpoints, Jamba's router.weight) and its fused
experts input_linear.weight [E, 2I, H] and output_linear.weight [E, H, I] (transformers'
experts.gate_up_proj and experts.down_proj under their checkpoint names); Inkling-2's fused
experts experts.w13_weight [E, 2I, H], the rows of gate and up interleaved (gate row i at 2i, up
row i at 2i + 1), and experts.w2_weight [E, H, I]; Laguna's bias as experts.e_score_correction_bias.

Every expert becomes w13 = [gate; up] [2I, H] and w2 = down [H, I] in its `WeightFormat`; with
tensor parallelism each rank keeps 1/tp of every intermediate, with expert parallelism its own
experts; fused shared experts are appended to the routed ones as `n_shared` extra experts.
"""

import itertools
import math
import re
from dataclasses import dataclass

import torch

from . import progress, quant
from .checkpoint import WeightError, non_finite_count, read_tensors
from .weight_formats import (
    BF16_MAX,
    Pair,
    WeightFormat,
    overflow_message,
    overflowing_block,
)

Parts = torch.Tensor | list[torch.Tensor]
"""A parameter's value: one tensor, or the rows of a stacked one (one per expert)."""

_PROJ = r"(gate_proj|up_proj|down_proj|w1|w3|w2)"
_FIELD = r"(weight|weight_scale_inv|weight_scale|scale|input_scale)"
_EXPERT = re.compile(rf"experts\.([0-9]+)\.{_PROJ}\.{_FIELD}")
"""A routed expert's projection, its index in ASCII digits (another script's digits, which int()
reads too, name no expert)."""
_SHARED = re.compile(rf"(?:shared_experts|shared_expert|shared_mlp)\.{_PROJ}\.{_FIELD}")
"""The shared experts' projections: DeepSeek's and HF's shared_experts, Flint's and Lara-Mini's
shared_expert, Granite's shared_mlp."""
_FUSED_SHARED = re.compile(
    r"(?:shared_experts|shared_expert)\.gate_up_proj\.(weight|weight_scale_inv|weight_scale|scale)"
)
"""A shared expert's gate and up stacked in one matrix [gate; up] (MiniMax-M3's), or their
block scales stacked likewise."""
_PROJECTIONS = {"w1": "gate", "w3": "up", "w2": "down"}
"""DeepSeek's names of the gated MLP's projections."""
_GATE_NAMES = (
    "gate.weight",
    "router.gate.weight",
    "gate.wg.weight",
    "router.weight",
    "router.layer.weight",
)
"""The router weight's names: HF's and DeepSeek's, AFMoE's, Hunyuan's, Granite's and Jamba's,
Granite's checkpoints'."""
_FUSED_NAMES = {
    "experts.gate_up_proj": "gate_up",
    "experts.down_proj": "down",
    "input_linear.weight": "gate_up",
    "output_linear.weight": "down",
    "experts.w13_weight": "gate_up_interleaved",
    "experts.w2_weight": "down",
}
"""The fused experts' names -> what each holds for every routed expert: gate_up [gate; up]
[2I, H] (transformers' in memory, Granite's checkpoints), gate_up_interleaved (gate and up rows
alternating: Inkling-2's checkpoints) or down [H, I]."""
_BIAS_NAMES = (
    "gate.e_score_correction_bias",
    "gate.bias",
    "gate.expert_bias",
    "e_score_correction_bias",
    "expert_bias",
    "experts.e_score_correction_bias",
)
"""The router's correction bias: HF's and DeepSeek's names, then the other models' (above)."""


@dataclass(frozen=True)
class LayerWeights:
    """Which tensors one rank's layer holds, and in which formats."""

    hidden: int
    intermediate: int
    """Of one routed expert, all tensor-parallel ranks together."""
    routed_experts: int
    local_experts: int
    """Routed experts on one rank."""
    n_shared: int
    shared_intermediate: int
    """Of all shared experts together, all tensor-parallel ranks together."""
    tp: int
    """Tensor-parallel ranks (each keeps 1/tp of every intermediate)."""
    ep: int
    """Expert-parallel ranks (each keeps local_experts whole experts)."""
    has_bias: bool
    """The router has `e_score_correction_bias`."""
    router_parts: bool
    """The layer holds the router weight as three bf16 parts (`gate_parts`), not fp32."""
    fused_shared: bool
    """Shared experts stored as extra routed experts."""
    routed: WeightFormat
    shared: WeightFormat | None
    hash_table: tuple[int, int] | None = None
    """(token ids, top-k) of a hash router's table `gate.tid2eid`; None: the router chooses."""
    physical_to_logical: tuple[int, ...] = ()
    """The logical expert of each physical expert of all ranks (rank r holds physical
    r * local_experts ..); empty: physical = logical. Replicas read one checkpoint tensor."""

    @property
    def shared_format(self) -> WeightFormat:
        """`shared`, for a layer that has shared experts."""
        if self.shared is None:
            raise ValueError("the layer has no shared experts")
        return self.shared


def load(layer, source, prefix: str, spec: LayerWeights) -> None:
    """Read the checkpoint, check every tensor, convert to this layer's formats, copy in.
    Raises WeightError listing every problem."""
    logical = _local_logical(layer, spec)
    wanted = _this_rank(set(logical), spec) if spec.ep > 1 else None
    try:
        found, names, problems = _collect(
            read_tensors(source, prefix, wanted), prefix, set(logical), spec
        )
    except WeightError as error:  # the checkpoint's own problems, before any tensor is copied
        raise WeightError(error.problems, unchanged=True) from None
    values: dict[str, torch.Tensor | None] = {}  # None: a problem, raised below
    values["gate_weight"] = _take(
        found, "gate", (spec.routed_experts, spec.hidden), prefix + "gate.weight", problems
    )
    if spec.has_bias:
        name = names.get("bias", prefix + "gate.e_score_correction_bias")
        values["gate_bias"] = _take(found, "bias", (spec.routed_experts,), name, problems)
    if spec.hash_table:
        values["tid2eid"] = _take_table(found.get("table"), prefix + "gate.tid2eid", spec, problems)
    rank = layer.rank if spec.tp > 1 else 0
    converted = {  # once per logical expert: its replicas share it
        e: _checkpoint_mlp(
            found, names, ("expert", e), f"{prefix}experts.{e}", spec, rank, problems
        )
        for e in dict.fromkeys(logical)
    }
    experts = [converted[e] for e in logical]
    shared = None
    if spec.n_shared:
        name = f"{prefix}shared_experts"
        shared = _checkpoint_mlp(found, names, ("shared", None), name, spec, rank, problems)
    if problems:
        raise WeightError(problems, unchanged=True)
    _copy_in(layer, _assemble(values, experts, shared, spec))
    if spec.router_parts:
        count_router_parts(layer)


def _router_values(values: dict, spec: LayerWeights) -> dict:
    """The router weight as the layer holds it: fp32, or its three bf16 parts."""
    if spec.router_parts:
        values["gate_parts"] = quant.split_bf16x3(values.pop("gate_weight"))
    return values


def count_router_parts(layer) -> None:
    """Set `layer.router_parts`: how many of the router weight's bf16 parts, from the first,
    are not all zero (one for a weight the checkpoint stores in bf16, as DeepSeek's do; at
    least one). The kernels read only those: the same logits, fewer GEMMs. A host sync: when
    the weights are set, never in a forward."""
    if layer.gate_parts.is_meta:  # a refused load of a meta layer: nothing to count
        return
    used = layer.gate_parts.flatten(1).ne(0).any(dim=1).tolist()
    layer.router_parts = max((i + 1 for i, nonzero in enumerate(used) if nonzero), default=1)


STATE_CHUNK = 1 << 24
"""Values checked at a time by state_problem: its temporaries stay small beside the tensor."""


def layout_problem(tensor: torch.Tensor) -> str:
    """Why `tensor` cannot be copied into a parameter ("" when it can): a sparse or nested
    tensor (copy_ refuses it, after nn.Module's load_state_dict copied the tensors before)."""
    if tensor.is_nested:
        return "a nested tensor: pass it dense"
    if tensor.layout != torch.strided:
        return f"a {tensor.layout} tensor: pass it dense (tensor.to_dense())"
    return ""


def assign_problem(tensors: dict[str, torch.Tensor]) -> str:
    """Why `tensors`, the parameters a load_state_dict(..., assign=True) leaves the layer with
    (the given tensors, the others as they are), cannot all be its parameters ("" when they
    can): assign makes each given tensor the parameter itself, which the kernels read as dense
    rows and load_weights and random_ write in place, so each must be contiguous (an expanded
    tensor repeats one row in memory), hold its values as they are (no negation bit) and own
    its memory (no two overlap)."""
    spans = []
    for name, tensor in tensors.items():
        if tensor.is_meta or tensor.numel() == 0:
            continue
        if not tensor.is_contiguous():
            kind = "an expanded tensor" if 0 in tensor.stride() else "not contiguous"
            return (
                f"{name} is {kind} (strides {list(tensor.stride())}); assign=True makes it "
                "the parameter: pass tensor.contiguous(), or load without assign (a copy)"
            )
        if tensor.is_neg():  # its memory holds the negated values, which the kernels read
            return (
                f"{name} is a view with torch's negation bit set; assign=True makes it the "
                "parameter: pass tensor.resolve_neg(), or load without assign (a copy)"
            )
        start = tensor.data_ptr()
        spans.append((tensor.device, start, start + tensor.numel() * tensor.element_size(), name))
    spans.sort(key=lambda span: (str(span[0]), span[1]))
    for before, after in itertools.pairwise(spans):
        if before[0] == after[0] and after[1] < before[2]:
            return (
                f"{before[3]} and {after[3]} share memory; assign=True makes each the "
                "parameter: pass copies (tensor.clone()), or load without assign"
            )
    return ""


def state_problem(name: str, tensor: torch.Tensor, spec: LayerWeights) -> str:
    """Why `tensor`, given to load_state_dict for the parameter `name` (its shape and dtype
    already the layer's), holds no values a layer runs on ("" when it does): nan or inf, a
    scale that is not > 0, a hash table id outside the experts (an index past the experts'
    weights in the kernels); overflow_problem checks each weight with its scales. load_weights
    refuses the same in a checkpoint."""
    rows = max(1, STATE_CHUNK // max(1, tensor[0].numel() if tensor.dim() else 1))
    parts = tensor.split(rows) if tensor.dim() else (tensor,)
    if name == "tid2eid":
        outside = sum(int(((p < 0) | (p >= spec.routed_experts)).sum()) for p in parts)
        if outside:
            return f"{outside} ids outside the experts 0..{spec.routed_experts - 1}"
        return ""
    bad = sum(non_finite_count(part) for part in parts)
    if bad:
        return f"{bad} of its {tensor.numel()} values are not finite (nan or inf)"
    if not (name.endswith("scale") and tensor.dtype.is_floating_point):
        return ""
    nonpositive = sum(int((part <= 0).sum()) for part in parts)
    if nonpositive:
        return f"{nonpositive} of its {tensor.numel()} scales are zero or negative (a scale is > 0)"
    fmt = _format_of(name, spec)
    if fmt.pow2_scales and not name.endswith("input_scale"):
        odd = sum(int((torch.frexp(part.float())[0] != 0.5).sum()) for part in parts)
        if odd:
            return (
                f"{odd} of its {tensor.numel()} scales are no power of two (the layer's "
                "scales are UE8M0)"
            )
    return ""


def overflow_problem(given: dict, own: dict, spec: LayerWeights) -> str:
    """Why the tensors given to load_state_dict hold a weight beyond bf16 ("" when none does):
    a block whose largest value times its scale passes bf16's largest, as load_weights refuses
    in a checkpoint. The other tensor of a pair not given whole is the layer's own (`own`, by
    name); values are read only where a scale is above bf16's largest over e4m3's (a weight
    of smaller scales is within bf16 whatever its values)."""
    for scale_name in sorted(own):
        weight_name = scale_name.removesuffix("_scale")
        if weight_name == scale_name or weight_name not in own:  # (input scales have none)
            continue
        if weight_name not in given and scale_name not in given:
            continue
        value = given.get(weight_name, own[weight_name])
        scale = given.get(scale_name, own[scale_name])
        if value.is_meta or scale.is_meta or not bool((scale > BF16_MAX / quant.E4M3_MAX).any()):
            continue
        fmt = _format_of(weight_name, spec)
        stacked = value.dim() == 3  # [experts, N, K]
        pairs = zip(value, scale, strict=True) if stacked else [(value, scale)]
        for index, (v, s) in enumerate(pairs):
            block = overflowing_block(v, s.to(v.device).float(), fmt.block, fmt.scheme == "mxfp4")
            if block is not None:
                where = f"expert {index}, block {block}" if stacked else f"block {block}"
                return overflow_message(scale_name, where, weight_name)
    return ""


def _format_of(name: str, spec: LayerWeights) -> WeightFormat:
    """The format of the layer's parameter `name`: the shared experts' or the routed ones'."""
    return spec.shared if name.startswith("shared_") and spec.shared is not None else spec.routed


def randomize(layer, seed: int, spec: LayerWeights) -> None:
    """Random weights of realistic scale: N(0, 1/fan_in) per expert, drawn per global expert so
    every rank layout builds the same layer; the router weight N(0, 1/hidden) rounded to bf16,
    as DeepSeek's checkpoints store it; router bias N(0, 0.02). Drawn in fp32, whatever torch's
    default dtype."""
    device = next(layer.parameters()).device
    generator = torch.Generator(device=device)

    def normal(rows: int, cols: int, stream: int) -> torch.Tensor:
        generator.manual_seed(seed * 100_003 + stream)
        draw = torch.randn(rows, cols, generator=generator, device=device, dtype=torch.float32)
        return draw / math.sqrt(cols)

    router = normal(spec.routed_experts, spec.hidden, 0)
    values = {"gate_weight": router.to(torch.bfloat16).float()}
    if spec.hash_table:  # k distinct experts per token id
        generator.manual_seed(seed * 100_003 + 2)
        vocab, top_k = spec.hash_table
        draws = torch.rand(
            vocab, spec.routed_experts, generator=generator, device=device, dtype=torch.float32
        )
        values["tid2eid"] = draws.argsort(dim=1)[:, :top_k].to(torch.int32)
    if spec.has_bias:
        generator.manual_seed(seed * 100_003 + 1)
        values["gate_bias"] = 0.02 * torch.randn(
            spec.routed_experts, generator=generator, device=device, dtype=torch.float32
        )

    rank = layer.rank if spec.tp > 1 else 0

    def mlp(inter: int, stream: int, fmt: WeightFormat) -> dict:
        shapes = (
            ("gate", (inter, spec.hidden)),
            ("up", (inter, spec.hidden)),
            ("down", (spec.hidden, inter)),
        )
        weights = {
            p: fmt.from_float(normal(*shape, stream + i)) for i, (p, shape) in enumerate(shapes)
        }
        out = _split_rank(weights, inter, rank, spec.tp, fmt)
        if fmt.static:  # static activation scales sized for unit-variance inputs (amax about 4)
            out["w13_input"] = torch.tensor(4.0 / 448.0, device=device, dtype=torch.float32)
            out["w2_input"] = torch.tensor(1.0 / 448.0, device=device, dtype=torch.float32)
        return out

    logical = _local_logical(layer, spec)
    line = progress.current()  # the layer's "random weights" line, drawn on a terminal
    experts = []
    for number, e in enumerate(logical, start=1):
        experts.append(mlp(spec.intermediate, 16 + 4 * e, spec.routed))
        if line is not None:
            line.update(number, f"expert {e}", total=len(logical))
    shared = mlp(spec.shared_intermediate, 8, spec.shared_format) if spec.n_shared else None
    _copy_in(layer, _assemble(values, experts, shared, spec))
    if spec.router_parts:
        count_router_parts(layer)


def _local_logical(layer, spec: LayerWeights) -> list[int]:
    """The logical expert of each of this rank's physical experts, in order."""
    first = layer.rank * spec.local_experts if spec.ep > 1 else 0
    physical = range(first, first + spec.local_experts)
    return [spec.physical_to_logical[p] if spec.physical_to_logical else p for p in physical]


def _this_rank(logical: set[int], spec: LayerWeights):
    """Which checkpoint names an expert-parallel rank reads: all but the routed experts it
    holds no replica of (ids out of range are read, to be reported)."""

    def wanted(name: str) -> bool:
        match = _EXPERT.fullmatch(name)
        if match is None:
            return True
        expert = int(match.group(1))
        return expert >= spec.routed_experts or expert in logical

    return wanted


def _collect(tensors, prefix: str, logical: set[int], spec: LayerWeights):
    """Sort checkpoint tensors by what they are: {key: tensor}, {key: its name in the
    checkpoint} and the problems found."""
    found: dict[tuple, torch.Tensor] = {}
    names: dict[tuple, str] = {}
    problems: list[str] = []
    twice: set[str] = set()  # names already reported

    def put(key, tensor: torch.Tensor, name: str) -> None:
        if key in found and name not in twice:  # two names for one weight: which is meant?
            twice.add(name)
            problems.append(
                f"{prefix}{name}: a second value of a weight the checkpoint already holds under "
                "another name (e.g. fused experts.gate_up_proj beside experts.<e>.gate_proj, or "
                "experts.1 beside experts.01): keep one"
            )
        found[key] = tensor
        names[key] = prefix + name

    for name, tensor in tensors:
        if name in _GATE_NAMES:
            put("gate", tensor, name)
        elif name == "gate.tid2eid":
            if spec.hash_table:
                put("table", tensor, name)
            else:
                problems.append(f"{prefix}{name}: unexpected (this router chooses by scores)")
        elif name in _BIAS_NAMES:
            if spec.has_bias:
                put("bias", tensor, name)
            else:
                problems.append(f"{prefix}{name}: unexpected (this router has no correction bias)")
        elif name in _FUSED_NAMES:
            if tensor.dim() != 3 or tensor.shape[0] != spec.routed_experts:
                inter, hidden = spec.intermediate, spec.hidden
                gate_up = _FUSED_NAMES[name] != "down"
                rows, cols = (2 * inter, hidden) if gate_up else (hidden, inter)
                problems.append(
                    f"{prefix}{name}: shape {list(tensor.shape)}, expected "
                    f"[{spec.routed_experts}, {rows}, {cols}] (a matrix of each routed expert)"
                )
            else:
                _split_fused(put, name, tensor, logical)
        elif match := _EXPERT.fullmatch(name):
            expert = int(match.group(1))
            if expert >= spec.routed_experts:
                problems.append(f"{prefix}{name}: unexpected (expert id >= {spec.routed_experts})")
            elif expert in logical:
                key = ("expert", expert, _proj(match.group(2)), _field(match.group(3)))
                put(key, tensor, name)
        elif (match := _FUSED_SHARED.fullmatch(name)) and spec.n_shared:
            if tensor.dim() != 2 or tensor.shape[0] % 2:
                problems.append(
                    f"{prefix}{name}: shape {list(tensor.shape)}, expected [2 x rows, cols]: "
                    "the shared experts' gate and up stacked"
                )
            else:
                gate, up = tensor.chunk(2, dim=0)
                put(("shared", None, "gate", _field(match.group(1))), gate, name)
                put(("shared", None, "up", _field(match.group(1))), up, name)
        elif match := _SHARED.fullmatch(name):
            if spec.n_shared:
                put(("shared", None, _proj(match.group(1)), _field(match.group(2))), tensor, name)
            elif tensor.numel():  # transformers saves zero-width shared experts when there are none
                problems.append(f"{prefix}{name}: unexpected (this layer has no shared experts)")
        else:
            problems.append(f"{prefix}{name}: unexpected")
    return found, names, problems


def _split_fused(put, name: str, fused: torch.Tensor, logical: set[int]) -> None:
    """Fused experts (_FUSED_NAMES) -> the gate / up / down weights of the experts this rank
    holds (an id beyond the tensor is left missing, to be reported)."""
    layout = _FUSED_NAMES[name]
    for expert in sorted(e for e in logical if e < fused.shape[0]):
        label = f"{name}[{expert}]"
        if layout == "down":
            put(("expert", expert, "down", "weight"), fused[expert], label)
            continue
        if layout == "gate_up_interleaved":
            gate, up = fused[expert, 0::2], fused[expert, 1::2]
        else:
            gate, up = fused[expert].chunk(2, dim=0)
        put(("expert", expert, "gate", "weight"), gate, label)
        put(("expert", expert, "up", "weight"), up, label)


def _field(name: str) -> str:
    return "scale" if name in ("weight_scale_inv", "weight_scale", "scale") else name


def _proj(name: str) -> str:
    """gate, up or down, from HF's gate_proj ... or DeepSeek's w1, w3, w2."""
    return _PROJECTIONS.get(name, name.removesuffix("_proj"))


def _take(found, key, shape, name, problems) -> torch.Tensor | None:
    tensor = found.get(key)
    if tensor is None:
        problems.append(f"{name}: missing")
        return None
    if tuple(tensor.shape) != tuple(shape):
        problems.append(f"{name}: shape {list(tensor.shape)}, expected {list(shape)}")
        return None
    if not tensor.dtype.is_floating_point:
        problems.append(f"{name}: {tensor.dtype}: expected floating-point values")
        return None
    values = tensor.float()
    if bool(torch.isfinite(tensor).all()) and not bool(torch.isfinite(values).all()):
        problems.append(f"{name}: values beyond fp32 (the router computes in fp32)")
        return None
    return values


def _take_table(table, name: str, spec: LayerWeights, problems) -> torch.Tensor | None:
    """The hash table as int32 expert ids [V, K], every id an expert of the layer."""
    if table is None:
        problems.append(f"{name}: missing (the hash router's table)")
        return None
    expected = spec.hash_table or ()
    if tuple(table.shape) != expected:
        problems.append(f"{name}: shape {list(table.shape)}, expected {list(expected)}")
        return None
    outside = (table < 0) | (table >= spec.routed_experts)
    if outside.any():
        problems.append(
            f"{name}: {int(outside.sum())} ids outside the experts 0..{spec.routed_experts - 1}"
        )
        return None
    return table.to(torch.int32)


def _checkpoint_mlp(found, names, key, name: str, spec: LayerWeights, rank: int, problems) -> dict:
    """One expert's (or the shared experts') w13 and w2 for this rank, from the checkpoint."""
    kind, index = key
    shared = kind == "shared"
    fmt = spec.shared_format if shared else spec.routed
    inter = spec.shared_intermediate if shared else spec.intermediate
    converted: dict[str, Pair] = {}
    for proj in ("gate", "up", "down"):
        shape = (spec.hidden, inter) if proj == "down" else (inter, spec.hidden)
        pair = fmt.from_checkpoint(
            found.get((kind, index, proj, "weight")),
            found.get((kind, index, proj, "scale")),
            shape,
            f"{name}.{proj}_proj",
            problems,
            (names.get((kind, index, proj, "weight")), names.get((kind, index, proj, "scale"))),
        )
        if pair is not None:  # None: its problems are listed
            converted[proj] = pair
    if len(converted) < 3:
        return {}
    result = _split_rank(converted, inter, rank, spec.tp, fmt)
    if fmt.static:
        inputs = [found.get((kind, index, proj, "input_scale")) for proj in ("gate", "up", "down")]
        if any(s is None for s in inputs):
            problems.append(f"{name}.*_proj.input_scale: missing (static activation scales)")
            return {}
        integer = [s.dtype for s in inputs if not s.dtype.is_floating_point]
        if integer:
            problems.append(f"{name}.*_proj.input_scale: {integer[0]}: expected floating point")
            return {}
        if any(s.numel() != 1 for s in inputs):
            problems.append(f"{name}.*_proj.input_scale: expected one value each")
            return {}
        gate, up, down = (s.float().reshape(()) for s in inputs)
        for proj, value in (("gate", gate), ("up", up), ("down", down)):
            if value <= 0:  # nan and inf: read_tensors reports them
                label = names.get(
                    (kind, index, proj, "input_scale"), f"{name}.{proj}_proj.input_scale"
                )
                problems.append(f"{label}: {float(value)}: an activation scale is > 0")
                return {}
        result["w13_input"] = torch.maximum(gate, up)
        result["w2_input"] = down
    return result


def _split_rank(weights: dict[str, Pair], inter: int, rank: int, tp: int, fmt) -> dict:
    """This rank's 1/tp of the intermediate: w13 = [gate; up] rows, w2 = down columns."""
    if tp > 1:
        part = inter // tp
        weights = {
            "gate": fmt.slice(weights["gate"], 0, rank * part, part),
            "up": fmt.slice(weights["up"], 0, rank * part, part),
            "down": fmt.slice(weights["down"], 1, rank * part, part),
        }
    return {"w13": fmt.concat_rows(weights["gate"], weights["up"]), "w2": weights["down"]}


def _split_shared(shared: dict, spec: LayerWeights) -> list[dict]:
    """The shared MLP of width n_shared * I as n_shared experts of width I: the gated activation
    is per column and the down projection a sum over columns, so the sum is the same. Static
    activation scales (per tensor) are the whole MLP's, so each part takes them."""
    fmt, total = spec.shared_format, spec.shared_intermediate
    width = total // spec.n_shared
    gate = fmt.slice(shared["w13"], 0, 0, total)
    up = fmt.slice(shared["w13"], 0, total, total)
    experts = []
    for j in range(spec.n_shared):
        g = fmt.slice(gate, 0, j * width, width)
        u = fmt.slice(up, 0, j * width, width)
        d = fmt.slice(shared["w2"], 1, j * width, width)
        part = {"w13": fmt.concat_rows(g, u), "w2": d}
        part.update({key: shared[key] for key in ("w13_input", "w2_input") if key in shared})
        experts.append(part)
    return experts


def _assemble(values: dict, experts: list[dict], shared: dict | None, spec) -> dict[str, Parts]:
    """The layer's parameters from converted experts: values and scales, those of the stacked
    parameters as lists of the experts' rows."""
    values = _router_values(values, spec)
    if spec.fused_shared and shared is not None:
        experts = experts + _split_shared(shared, spec)
    values.update(_stack("w13", [e["w13"] for e in experts]))
    values.update(_stack("w2", [e["w2"] for e in experts]))
    if spec.routed.static:
        values["w13_input_scale"] = torch.stack([e["w13_input"] for e in experts]).amax().reshape(1)
        values["w2_input_scale"] = torch.stack([e["w2_input"] for e in experts]).amax().reshape(1)
    if shared is not None and not spec.fused_shared:
        values.update(_stack("shared_w13", [shared["w13"]], single=True))
        values.update(_stack("shared_w2", [shared["w2"]], single=True))
        if spec.shared.static:
            values["shared_w13_input_scale"] = shared["w13_input"].reshape(1)
            values["shared_w2_input_scale"] = shared["w2_input"].reshape(1)
    return values


def _stack(name: str, parts: list[Pair], single: bool = False) -> dict[str, Parts]:
    """[(value, scale)] per expert -> {name: the values, name_scale: the scales}, one tensor
    each for `single`, else a list of the experts' tensors: _copy_in writes each into its row
    of the stacked parameter, so no stacked copy of all experts is ever made (a bf16
    DeepSeek-V3 layer is 21 GB: stacking held it three times at once)."""
    pick = (lambda xs: xs[0]) if single else list
    out = {name: pick([value for value, _ in parts])}
    scales = [scale for _, scale in parts if scale is not None]
    if scales:  # every part of one format: all scaled, or none
        out[name + "_scale"] = pick(scales)
    return out


def _copy_in(layer, values: dict[str, Parts]) -> None:
    """Every value checked against its parameter, then copied in, a list one expert's row at a
    time (moved to the layer's device row by row): nothing is written unless everything can
    be."""
    for name, value in values.items():
        param = getattr(layer, name)
        rows = value if isinstance(value, list) else [value]
        shapes = {(len(rows), *row.shape) if isinstance(value, list) else row.shape for row in rows}
        dtypes = {row.dtype for row in rows}
        if shapes != {tuple(param.shape)} or dtypes != {param.dtype}:
            built = " / ".join(f"{list(shape)}" for shape in sorted(shapes))
            kinds = " / ".join(sorted(str(dtype) for dtype in dtypes))
            raise WeightError(
                [
                    f"{name}: built {built} {kinds}, the layer holds {list(param.shape)} {param.dtype}"
                ],
                unchanged=True,
            )
    # A value may be a view of a parameter (the layer's own tensors, re-ordered): copied first,
    # so that no row is read after another row's write replaced it.
    held = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    values = {
        name: (
            [row.clone() if row.untyped_storage().data_ptr() in held else row for row in value]
            if isinstance(value, list)
            else value.clone()
            if value.untyped_storage().data_ptr() in held
            else value
        )
        for name, value in values.items()
    }
    with torch.no_grad():
        for name, value in values.items():
            param = getattr(layer, name).data
            if isinstance(value, list):
                for row, part in zip(param, value, strict=True):
                    row.copy_(part)
            else:
                param.copy_(value)
