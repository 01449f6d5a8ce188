"""Rules over the whole combination: each one named, documented, and tested with a spec that
breaks it.

A rule takes the normalized `Spec` and yields the `Problem`s it finds; `check(spec)` runs them
all, so a user sees every problem at once. The support matrix (`moec explain --matrix`) is
generated from these same functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from moec.errors import Problem, problem
from moec.spec import memory, placement
from moec.spec.models import Spec

Check = Callable[[Spec], Iterator[Problem]]


@dataclass(frozen=True)
class Rule:
    name: str
    doc: str
    check: Check


RULES: list[Rule] = []

SIGMOID_FAMILY = ("sigmoid", "sqrtsoftplus")
SILU_FAMILY = ("silu", "silu_clamped", "oai_swiglu")
BLOCK_SCHEMES = ("fp8_block", "mxfp8", "mxfp4")
FP8_SCHEMES = ("fp8_per_tensor", "fp8_block", "mxfp8")
ARCH_NUMBER = {"sm80": 80, "sm89": 89, "sm90": 90, "sm100": 100, "sm120": 120}
DEEPEP = ("deepep_normal", "deepep_low_latency")


def rule(name: str) -> Callable[[Check], Check]:
    """Register `check` as the rule `name`; its docstring is the rule's documentation."""

    def register(check: Check) -> Check:
        RULES.append(Rule(name, (check.__doc__ or "").strip(), check))
        return check

    return register


def check(spec: Spec) -> list[Problem]:
    """Every problem every rule finds in `spec` (normalized)."""
    found: list[Problem] = []
    for each in RULES:
        for found_problem in each.check(spec):
            found.append(
                Problem(
                    found_problem.path,
                    found_problem.message,
                    found_problem.hint,
                    found_problem.value,
                    found_problem.has_value,
                    rule=each.name,
                )
            )
    return found


def problems_of(rule_name: str, spec: Spec) -> list[Problem]:
    """What one named rule finds in `spec` (the planner asks before choosing a backend)."""
    (found,) = [each for each in RULES if each.name == rule_name]
    return list(found.check(spec))


def intermediate_per_rank(spec: Spec) -> int:
    return spec.model.moe_intermediate_size // spec.parallel.tp_size


def arch_number(spec: Spec) -> int:
    return ARCH_NUMBER[spec.target.arch] if spec.target.arch else 0


# --- quantization -------------------------------------------------------------------------


@rule("block_shape")
def _block_shape(spec: Spec) -> Iterator[Problem]:
    """weight_block is [block_n, block_k] for block schemes, and absent otherwise."""
    quant = spec.quant
    if quant.scheme not in BLOCK_SCHEMES:
        if quant.weight_block is not None:
            yield problem(
                "quant.weight_block",
                f"only block-scaled schemes take a weight block, not {quant.scheme}",
                "remove it, or use scheme fp8_block, mxfp8 or mxfp4",
                value=quant.weight_block,
            )
    elif quant.weight_block is not None and len(quant.weight_block) != 2:
        yield problem(
            "quant.weight_block",
            f"block quantization needs two block dims, got {len(quant.weight_block)}",
            "[block_n, block_k], e.g. [128, 128]",
            value=quant.weight_block,
        )


@rule("mx_block_and_scales")
def _mx_block(spec: Spec) -> Iterator[Problem]:
    """MXFP8 and MXFP4 use 1x32 weight blocks with UE8M0 scales (the OCP MX format)."""
    quant = spec.quant
    if quant.scheme not in ("mxfp8", "mxfp4"):
        return
    if quant.weight_block is not None and list(quant.weight_block) != [1, 32]:
        yield problem(
            "quant.weight_block",
            f"{quant.scheme} needs weight_block = [1, 32]",
            "[1, 32], or leave it out",
            value=quant.weight_block,
        )
    if quant.scale_dtype != "ue8m0":
        yield problem(
            "quant.scale_dtype",
            f"{quant.scheme} scales are UE8M0",
            '"ue8m0", or leave it out',
            value=quant.scale_dtype,
        )


@rule("fp8_block_shape")
def _fp8_block_shape(spec: Spec) -> Iterator[Problem]:
    """fp8_block means DeepSeek-V3's recipe: 128x128 weight blocks and 1x128 activation groups,
    which the GEMM kernels' K and N blocks are built around."""
    quant = spec.quant
    if quant.scheme != "fp8_block" or quant.weight_block is None or len(quant.weight_block) != 2:
        return
    if list(quant.weight_block) != [128, 128]:
        yield problem(
            "quant.weight_block",
            "fp8_block kernels (1x128 activation groups, 128x128 weight blocks) need [128, 128]",
            "[128, 128], or leave it out",
            value=quant.weight_block,
        )


@rule("block_dynamic_activations")
def _block_dynamic(spec: Spec) -> Iterator[Problem]:
    """Block-scaled schemes quantize activations per token group at run time (dynamic)."""
    if spec.quant.scheme in BLOCK_SCHEMES and spec.quant.activation_scheme != "dynamic":
        yield problem(
            "quant.activation_scheme",
            f"{spec.quant.scheme} needs dynamic activation scales",
            '"dynamic"',
            value=spec.quant.activation_scheme,
        )


@rule("static_needs_per_tensor")
def _static(spec: Spec) -> Iterator[Problem]:
    """Static activation scales are per tensor: only fp8_per_tensor has them."""
    quant = spec.quant
    if quant.activation_scheme == "static" and quant.scheme != "fp8_per_tensor":
        if quant.scheme not in BLOCK_SCHEMES:  # block schemes: reported by the rule above
            yield problem(
                "quant.activation_scheme",
                f"static activation scales need scheme fp8_per_tensor, not {quant.scheme}",
                '"dynamic", or scheme = "fp8_per_tensor"',
                value=quant.activation_scheme,
            )


@rule("scale_dtype_applies")
def _scale_dtype(spec: Spec) -> Iterator[Problem]:
    """bf16 has no scales; a per-tensor scale is fp32."""
    quant = spec.quant
    if quant.scheme == "bf16" and quant.scale_dtype is not None:
        yield problem(
            "quant.scale_dtype",
            "scheme bf16 has no scales",
            "remove it",
            value=quant.scale_dtype,
        )
    if quant.scheme == "fp8_per_tensor" and quant.scale_dtype == "ue8m0":
        yield problem(
            "quant.scale_dtype",
            "a per-tensor scale is fp32",
            '"fp32", or a block scheme for UE8M0 scales',
            value=quant.scale_dtype,
        )


@rule("block_divides_intermediate")
def _block_divides(spec: Spec) -> Iterator[Problem]:
    """With block scales, the per-rank intermediate size is a multiple of block_n (gate/up
    output blocks) and, with tensor parallelism, of block_k (down input blocks)."""
    quant = spec.quant
    if quant.scheme not in BLOCK_SCHEMES or not quant.weight_block or len(quant.weight_block) != 2:
        return
    block_n, block_k = quant.weight_block
    per_rank = intermediate_per_rank(spec)
    if per_rank % block_n:
        yield problem(
            "model.moe_intermediate_size",
            f"the per-rank intermediate size {per_rank} is not divisible by block_n = {block_n}",
            f"a multiple of {block_n * spec.parallel.tp_size}",
            value=spec.model.moe_intermediate_size,
        )
    if spec.parallel.tp_size > 1 and per_rank % block_k:
        yield problem(
            "model.moe_intermediate_size",
            f"with tp_size = {spec.parallel.tp_size} the per-rank intermediate size {per_rank} "
            f"is not divisible by block_k = {block_k}",
            f"a multiple of {block_k * spec.parallel.tp_size}",
            value=spec.model.moe_intermediate_size,
        )


@rule("block_divides_shared")
def _block_divides_shared(spec: Spec) -> Iterator[Problem]:
    """With block scales on separate shared experts, their per-rank width (n_shared x the
    intermediate size) is a multiple of block_n: the checkpoint scales gate and up apart, and
    the layer's [gate; up] weight keeps one scale per block_n rows; an mx scheme's groups of 32
    also divide hidden_size, its gate/up input. (Fused shared experts are routed experts of
    the intermediate size, which block_divides_intermediate checks.)"""
    quant, model = spec.quant, spec.model
    if quant.shared_scheme not in BLOCK_SCHEMES or not model.n_shared_experts:
        return
    if spec.experts.shared_experts == "fused":
        return
    if quant.shared_scheme != "fp8_block":  # mx: 1 x 32 groups along K, the down input
        block, what = 32, "group size"
    elif quant.scheme == "fp8_block" and quant.weight_block and len(quant.weight_block) == 2:
        block, what = quant.weight_block[0], "block_n"
    else:
        block, what = 128, "block_n"
    if block == 32 and model.hidden_size % 32:  # mx: the gate/up input in groups of 32 too
        yield problem(
            "model.hidden_size",
            f"the shared scheme {quant.shared_scheme}'s groups of 32 columns do not divide "
            "hidden_size (the shared experts' gate/up input)",
            "a multiple of 32, or quant.shared_scheme fp8_block, fp8_per_tensor or bf16",
            value=model.hidden_size,
        )
    width = model.n_shared_experts * model.moe_intermediate_size // spec.parallel.tp_size
    if width % block:
        yield problem(
            "model.moe_intermediate_size",
            f"the shared experts' per-rank width {width} (n_shared_experts x "
            f"moe_intermediate_size) is not divisible by the shared scheme "
            f"{quant.shared_scheme}'s {what} {block}",
            f"a width that is a multiple of {block}, or quant.shared_scheme without blocks",
            value=model.moe_intermediate_size,
        )


@rule("group_divides_hidden")
def _group_divides_hidden(spec: Spec) -> Iterator[Problem]:
    """Activations are quantized in groups of block_k columns: hidden_size must be a multiple."""
    quant = spec.quant
    if quant.scheme not in BLOCK_SCHEMES or not quant.weight_block or len(quant.weight_block) != 2:
        return
    block_k = quant.weight_block[1]
    if spec.model.hidden_size % block_k:
        yield problem(
            "model.hidden_size",
            f"activation groups of {block_k} columns do not divide hidden_size",
            f"a multiple of {block_k}",
            value=spec.model.hidden_size,
        )


@rule("groups_divide_intermediate")
def _groups_divide_intermediate(spec: Spec) -> Iterator[Problem]:
    """The down GEMM's input is quantized in groups of block_k columns along the intermediate:
    the per-rank intermediate size is a multiple of block_k (with tp_size > 1 the rule above
    reports it)."""
    quant = spec.quant
    if quant.scheme not in BLOCK_SCHEMES or not quant.weight_block or len(quant.weight_block) != 2:
        return
    block_k = quant.weight_block[1]
    if spec.parallel.tp_size == 1 and intermediate_per_rank(spec) % block_k:
        yield problem(
            "model.moe_intermediate_size",
            f"activation groups of {block_k} columns do not divide the intermediate size",
            f"a multiple of {block_k}",
            value=spec.model.moe_intermediate_size,
        )


@rule("checkpoint_format")
def _checkpoint(spec: Spec) -> Iterator[Problem]:
    """mxfp4 weights, routed or shared, are not made from bf16 on load (the rounding loses too
    much); a static activation scale only exists in a quantized checkpoint."""
    quant = spec.quant
    if quant.scheme == "mxfp4" and quant.checkpoint == "bf16":
        yield problem(
            "quant.checkpoint",
            "mxfp4 experts load from an mxfp4 checkpoint, not quantized from bf16",
            '"quantized"',
            value=quant.checkpoint,
        )
    elif quant.shared_scheme == "mxfp4" and spec.model.n_shared_experts:
        if quant.scheme == "bf16":  # a bf16 layer reads a bf16 checkpoint, shared experts too
            yield problem(
                "quant.shared_scheme",
                "mxfp4 shared experts load from an mxfp4 checkpoint, and a bf16 layer's is bf16",
                '"fp8_block", "fp8_per_tensor" or "mxfp8", quantized from bf16 on load',
                value=quant.shared_scheme,
            )
        elif quant.checkpoint == "bf16":
            yield problem(
                "quant.checkpoint",
                "mxfp4 shared experts load from an mxfp4 checkpoint, not quantized from bf16",
                '"quantized", or another quant.shared_scheme',
                value=quant.checkpoint,
            )
    if (
        quant.activation_scheme == "static"
        and quant.scheme == "fp8_per_tensor"  # other schemes: reported by the rules above
        and quant.checkpoint == "bf16"
    ):
        yield problem(
            "quant.checkpoint",
            "static activation scales come from a quantized checkpoint (input_scale)",
            '"quantized", or activation_scheme = "dynamic"',
            value=quant.checkpoint,
        )


# --- router -------------------------------------------------------------------------------


@rule("topk_within_experts")
def _topk(spec: Spec) -> Iterator[Problem]:
    """A token selects at most n_routed_experts experts."""
    if spec.model.num_experts_per_tok > spec.model.n_routed_experts:
        yield problem(
            "model.num_experts_per_tok",
            f"top-k exceeds n_routed_experts = {spec.model.n_routed_experts}",
            f"at most {spec.model.n_routed_experts}",
            value=spec.model.num_experts_per_tok,
        )


@rule("grouped_topk_shape")
def _grouped(spec: Spec) -> Iterator[Problem]:
    """Grouped top-k: n_group divides n_routed_experts, topk_group <= n_group, and the kept
    groups hold at least top_k experts. greedy takes no groups."""
    router, model = spec.router, spec.model
    if router.topk_method == "hash":  # rule hash_routing
        return
    if router.topk_method == "greedy":
        if router.n_group != 1 or router.topk_group != 1:
            yield problem(
                "router.n_group" if router.n_group != 1 else "router.topk_group",
                "greedy top-k does not use expert groups",
                'n_group = 1 and topk_group = 1, or topk_method = "group_limited_greedy"',
                value=router.n_group if router.n_group != 1 else router.topk_group,
            )
        return
    if model.n_routed_experts % router.n_group:
        yield problem(
            "router.n_group",
            f"does not divide n_routed_experts = {model.n_routed_experts}",
            "a divisor of n_routed_experts",
            value=router.n_group,
        )
        return
    if router.topk_group > router.n_group:
        yield problem(
            "router.topk_group",
            f"keeps more groups than n_group = {router.n_group}",
            f"at most {router.n_group}",
            value=router.topk_group,
        )
        return
    per_group = model.n_routed_experts // router.n_group
    if model.num_experts_per_tok > router.topk_group * per_group:
        yield problem(
            "model.num_experts_per_tok",
            f"the {router.topk_group} kept groups of {per_group} experts hold fewer experts "
            "than top-k",
            f"at most {router.topk_group * per_group}, or a larger topk_group",
            value=model.num_experts_per_tok,
        )
    if router.topk_method == "noaux_tc" and router.n_group > 1 and per_group < 2:
        yield problem(
            "router.n_group",
            "noaux_tc ranks groups by the sum of their top-2 scores: groups need 2 experts",
            f"at most {model.n_routed_experts // 2}",
            value=router.n_group,
        )


@rule("hash_routing")
def _hash(spec: Spec) -> Iterator[Problem]:
    """Hash routing takes its experts from a [vocab_size, top_k] table of token ids: it needs
    model.vocab_size and uses no expert groups; vocab_size sizes nothing else."""
    router, model = spec.router, spec.model
    if router.topk_method != "hash":
        if model.vocab_size is not None:
            yield problem(
                "model.vocab_size",
                "sizes the hash table only, and this router chooses by scores",
                'remove it, or router.topk_method = "hash"',
                value=model.vocab_size,
            )
        return
    if model.vocab_size is None:
        yield problem(
            "model.vocab_size",
            "is missing: hash routing looks each token id up in a [vocab_size, top_k] table",
            "the model's vocab_size, e.g. 129280",
        )
    for key in ("n_group", "topk_group"):
        if getattr(router, key) != 1:
            yield problem(
                f"router.{key}",
                "hash routing takes its experts from the table, not from expert groups",
                "1",
                value=getattr(router, key),
            )


@rule("noaux_tc_scoring")
def _noaux(spec: Spec) -> Iterator[Problem]:
    """noaux_tc adds e_score_correction_bias to independent per-expert scores: it needs a
    sigmoid-family scoring function, not softmax."""
    if spec.router.topk_method == "noaux_tc" and spec.router.scoring_func not in SIGMOID_FAMILY:
        yield problem(
            "router.scoring_func",
            "noaux_tc needs sigmoid-family scoring",
            '"sigmoid" or "sqrtsoftplus"',
            value=spec.router.scoring_func,
        )


# --- experts and backends -----------------------------------------------------------------


@rule("shared_scheme_without_shared_experts")
def _shared_scheme_without_shared(spec: Spec) -> Iterator[Problem]:
    """A shared-expert scheme needs shared experts to quantize (left out, none is filled in)."""
    if spec.quant.shared_scheme is not None and spec.model.n_shared_experts == 0:
        yield problem(
            "quant.shared_scheme",
            "there are no shared experts to quantize (model.n_shared_experts = 0)",
            "leave quant.shared_scheme out, or set model.n_shared_experts",
            value=spec.quant.shared_scheme,
        )


@rule("overlapped_shared_experts")
def _overlapped_shared(spec: Spec) -> Iterator[Problem]:
    """Overlapped shared experts need shared experts to run."""
    if spec.experts.shared_experts == "overlapped" and spec.model.n_shared_experts == 0:
        yield problem(
            "experts.shared_experts",
            "there are no shared experts to overlap (n_shared_experts = 0)",
            '"separate", or set model.n_shared_experts',
            value="overlapped",
        )


@rule("fused_shared_experts")
def _fused_shared(spec: Spec) -> Iterator[Problem]:
    """Fused shared experts run inside the routed grouped GEMM: there must be shared experts,
    in the routed experts' quant scheme, on one rank's full intermediate (no TP, no EP)."""
    if spec.experts.shared_experts != "fused":
        return
    if spec.model.n_shared_experts == 0:
        yield problem(
            "experts.shared_experts",
            "there are no shared experts to fuse (n_shared_experts = 0)",
            '"separate", or set model.n_shared_experts',
            value="fused",
        )
    elif spec.quant.shared_scheme != spec.quant.scheme:  # (none to fuse: no scheme to match)
        yield problem(
            "quant.shared_scheme",
            f"fused shared experts need the routed experts' scheme {spec.quant.scheme}",
            f'"{spec.quant.scheme}", or experts.shared_experts = "separate"',
            value=spec.quant.shared_scheme,
        )
    if spec.parallel.ep_size > 1:
        yield problem(
            "experts.shared_experts",
            "with expert parallelism a fused shared expert would live on one rank only",
            '"separate"',
            value="fused",
        )
    if spec.parallel.tp_size > 1:
        yield problem(
            "experts.shared_experts",
            "with tensor parallelism the shared MLP is split by columns on every rank, "
            "which the fused experts (whole routed-expert widths) cannot hold",
            '"separate", or parallel.tp_size = 1',
            value="fused",
        )


@rule("deep_gemm_target")
def _deep_gemm(spec: Spec) -> Iterator[Problem]:
    """DeepGEMM runs on CUDA sm90 or newer, for silu-family activations, fp8 (block or MX) or
    bf16 weights, bfloat16 outputs, and dims that are multiples of 128; its fp8 scales are fp32
    on sm90 and UE8M0 on sm100."""
    if spec.experts.gemm_backend != "deep_gemm":
        return
    path = "experts.gemm_backend"
    if spec.target.device != "cuda" or arch_number(spec) < 90:
        yield problem(
            path,
            "deep_gemm needs a CUDA target of sm90 or newer",
            'target.device = "cuda" with arch sm90 or sm100, or gemm_backend "triton" or "torch"',
            value="deep_gemm",
        )
    if spec.activation.kind not in SILU_FAMILY:
        yield problem(
            "activation.kind",
            "the deep_gemm backend has no fused kernel for this activation",
            "silu, silu_clamped or oai_swiglu, or gemm_backend triton",
            value=spec.activation.kind,
        )
    if spec.quant.scheme not in ("bf16", "fp8_block", "mxfp8", "mxfp4"):
        yield problem(
            "quant.scheme",
            "deep_gemm grouped GEMMs take bf16 or block-scaled fp8 weights",
            '"bf16", "fp8_block", "mxfp8" (sm100) or "mxfp4" (sm90, as fp8), or gemm_backend '
            '"triton"',
            value=spec.quant.scheme,
        )
    if spec.quant.scheme == "mxfp4" and arch_number(spec) != 90:
        yield problem(
            "quant.scheme",
            "moec runs mxfp4 experts on deep_gemm only on sm90, converted to fp8 blocks at load",
            'target.arch = "sm90", or gemm_backend "triton"',
            value="mxfp4",
        )
    if spec.quant.scheme == "mxfp8" and arch_number(spec) < 100:
        yield problem(
            "quant.scheme",
            "deep_gemm runs mxfp8 on sm100 only",
            'target.arch = "sm100", or gemm_backend "triton"',
            value="mxfp8",
        )
    if spec.target.dtype != "bfloat16":
        yield problem(
            "target.dtype",
            "deep_gemm writes bfloat16 outputs",
            '"bfloat16"',
            value=spec.target.dtype,
        )
    for key, size in (
        ("model.hidden_size", spec.model.hidden_size),
        ("model.moe_intermediate_size", intermediate_per_rank(spec)),
    ):
        if size % 128:
            yield problem(
                key,
                f"deep_gemm needs dims that are multiples of 128 (per rank: {size})",
                "a multiple of 128",
                value=getattr(spec.model, key.split(".")[1]),
            )
    if spec.quant.scheme == "fp8_block" and spec.target.arch:
        wanted = "ue8m0" if arch_number(spec) >= 100 else "fp32"
        if spec.quant.scale_dtype != wanted:
            yield problem(
                "quant.scale_dtype",
                f"deep_gemm on {spec.target.arch} takes {wanted} scales",
                f'"{wanted}"',
                value=spec.quant.scale_dtype,
            )


@rule("fp8_needs_arch")
def _fp8_arch(spec: Spec) -> Iterator[Problem]:
    """fp8 tensor-core GEMMs need sm89 or newer; on older GPUs only the torch backend (which
    dequantizes) runs fp8 weights."""
    if (
        spec.target.device == "cuda"
        and spec.quant.scheme != "bf16"
        and spec.experts.gemm_backend in ("triton", "deep_gemm")
        and 0 < arch_number(spec) < 89
    ):
        yield problem(
            "target.arch",
            f"{spec.quant.scheme} GEMMs need fp8 tensor cores (sm89 or newer)",
            '"sm89", "sm90" or "sm100", or experts.gemm_backend = "torch"',
            value=spec.target.arch,
        )


@rule("quantized_not_float16")
def _quantized_float16(spec: Spec) -> Iterator[Problem]:
    """Quantized schemes write their GEMM outputs in the target dtype; float16 (max 65504)
    overflows where DeepSeek's fp8 experts' bf16 outputs do not."""
    if spec.target.dtype == "float16" and spec.quant.scheme != "bf16":
        yield problem(
            "target.dtype",
            "float16 outputs of fp8 GEMMs can overflow (max 65504)",
            '"bfloat16" or "float32"',
            value="float16",
        )


@rule("masked_budget_needs_auto")
def _masked_budget(spec: Spec) -> Iterator[Problem]:
    """masked_memory_budget_gib only steers layout = "auto"."""
    experts = spec.experts
    if experts.masked_memory_budget_gib is not None and experts.layout != "auto":
        yield problem(
            "experts.masked_memory_budget_gib",
            f'has no effect with layout = "{experts.layout}"',
            'remove it, or layout = "auto"',
            value=experts.masked_memory_budget_gib,
        )


# --- parallelism --------------------------------------------------------------------------


@rule("nodes_divide_ranks")
def _nodes(spec: Spec) -> Iterator[Problem]:
    """Ranks are spread evenly over the nodes: nodes divides tp_size * ep_size."""
    parallel = spec.parallel
    world = parallel.tp_size * parallel.ep_size
    if world % parallel.nodes:
        yield problem(
            "parallel.nodes",
            f"does not divide the {world} ranks (tp_size * ep_size)",
            f"a divisor of {world}",
            value=parallel.nodes,
        )


@rule("tp_within_experts")
def _tp(spec: Spec) -> Iterator[Problem]:
    """Tensor parallelism splits each expert's intermediate: tp_size <= n_routed_experts (as
    SGLang requires) and tp_size divides moe_intermediate_size (and so the shared experts'
    n_shared_experts * moe_intermediate_size)."""
    parallel, model = spec.parallel, spec.model
    if parallel.tp_size > model.n_routed_experts:
        yield problem(
            "parallel.tp_size",
            f"exceeds n_routed_experts = {model.n_routed_experts}",
            f"at most {model.n_routed_experts}",
            value=parallel.tp_size,
        )
    if model.moe_intermediate_size % parallel.tp_size:
        yield problem(
            "parallel.tp_size",
            f"does not divide moe_intermediate_size = {model.moe_intermediate_size}",
            "a divisor of moe_intermediate_size",
            value=parallel.tp_size,
        )


@rule("ep_divides_experts")
def _ep(spec: Spec) -> Iterator[Problem]:
    """Expert parallelism gives each rank (n_routed_experts + redundant_experts) / ep_size whole
    physical experts."""
    redundant = spec.parallel.redundant_experts
    physical = spec.model.n_routed_experts + redundant
    if physical % spec.parallel.ep_size:
        what = f"n_routed_experts = {spec.model.n_routed_experts}"
        if redundant:
            what = f"the {physical} physical experts ({what} + redundant_experts = {redundant})"
        yield problem(
            "parallel.ep_size",
            f"does not divide {what}",
            "a divisor of n_routed_experts + redundant_experts",
            value=spec.parallel.ep_size,
        )


@rule("placement_covers_experts")
def _placement(spec: Spec) -> Iterator[Problem]:
    """A placement other than "even" lists ep_size ranks of equal length, together
    n_routed_experts + redundant_experts physical experts, each a routed expert's id, every
    routed expert at least once."""
    parallel = spec.parallel
    if isinstance(parallel.placement, str):  # "even", or a file the loader read (or refused)
        return
    found = placement.problems(
        [list(rank) for rank in parallel.placement],
        spec.model.n_routed_experts,
        parallel.redundant_experts,
        parallel.ep_size,
    )
    for message in found:
        yield problem(
            "parallel.placement",
            message,
            "each rank's list of logical expert ids, as `moec eplb` writes them",
        )


@rule("replicas_not_fused_shared")
def _replicas_fused(spec: Spec) -> Iterator[Problem]:
    """Fused shared experts take the grouped GEMM's last expert slots; with redundant experts or
    a placement of its own a layer keeps them separate."""
    parallel = spec.parallel
    if spec.experts.shared_experts == "fused" and placed(spec):
        yield problem(
            "experts.shared_experts",
            "fused shared experts cannot sit beside a placement of replicated experts",
            '"separate", "overlapped" or "auto", or parallel.redundant_experts = 0 and '
            'placement = "even"',
            value="fused",
        )
    found = placement.replica_choice_problem(
        parallel.replica_choice,
        parallel.redundant_experts,
        "parallel.replica_choice",
        "parallel.redundant_experts",
        "redundant_experts = 0",
    )
    if found is not None:
        yield found


def placed(spec: Spec) -> bool:
    """Whether physical experts differ from the logical ones (replicas, or another order)."""
    parallel = spec.parallel
    return bool(parallel.redundant_experts) or parallel.placement not in (
        "even",
        placement.even(spec.model.n_routed_experts, 0, parallel.ep_size),
    )


@rule("dispatch_matches_ep")
def _dispatch_ep(spec: Spec) -> Iterator[Problem]:
    """local dispatch keeps all experts on each rank (ep_size = 1); all2all and DeepEP exchange
    tokens between expert-parallel ranks (ep_size > 1); moec does not combine TP and EP inside
    the MoE layer."""
    parallel = spec.parallel
    if parallel.dispatch == "local" and parallel.ep_size > 1:
        yield problem(
            "parallel.dispatch",
            f"local dispatch cannot reach experts on other ranks (ep_size = {parallel.ep_size})",
            '"all2all", "deepep_normal" or "deepep_low_latency", or ep_size = 1',
            value="local",
        )
    if parallel.dispatch != "local" and parallel.ep_size == 1:
        yield problem(
            "parallel.ep_size",
            f"{parallel.dispatch} dispatch needs expert parallelism",
            'ep_size > 1, or dispatch = "local"',
            value=1,
        )
    if parallel.ep_size > 1 and parallel.tp_size > 1:
        yield problem(
            "parallel.tp_size",
            "moec shards the MoE layer by TP or by EP, not both",
            "tp_size = 1 with ep_size > 1",
            value=parallel.tp_size,
        )


@rule("ep_needs_group_scales")
def _ep_scales(spec: Spec) -> Iterator[Problem]:
    """Expert-parallel dispatch brings tokens of several ranks into one GEMM: their activation
    scales must travel with each token (per-group scales), not be one per-tensor scale per rank."""
    if spec.parallel.ep_size > 1 and spec.quant.scheme == "fp8_per_tensor":
        yield problem(
            "quant.scheme",
            "per-tensor activation scales differ per rank, so expert-parallel ranks cannot share them",
            '"fp8_block", "mxfp8" or "bf16", or ep_size = 1',
            value="fp8_per_tensor",
        )


@rule("token_bound_applies")
def _token_bound(spec: Spec) -> Iterator[Problem]:
    """max_tokens_per_rank sizes exchange buffers: it applies to expert-parallel dispatch."""
    if spec.parallel.max_tokens_per_rank is not None and spec.parallel.dispatch == "local":
        yield problem(
            "parallel.max_tokens_per_rank",
            "local dispatch exchanges no tokens",
            "remove it, or an expert-parallel dispatch",
            value=spec.parallel.max_tokens_per_rank,
        )


@rule("nic_bandwidth_needs_nodes")
def _nic_bandwidth(spec: Spec) -> Iterator[Problem]:
    """nic_bandwidth_gbs prices traffic between nodes: it applies from nodes = 2."""
    if spec.parallel.nic_bandwidth_gbs is not None and spec.parallel.nodes == 1:
        yield problem(
            "parallel.nic_bandwidth_gbs",
            "has no effect with nodes = 1: ranks of one node talk over NVLink, not the NIC",
            "remove it, or set parallel.nodes",
            value=spec.parallel.nic_bandwidth_gbs,
        )


# --- target -------------------------------------------------------------------------------


@rule("arch_needs_cuda")
def _arch(spec: Spec) -> Iterator[Problem]:
    """target.arch names a CUDA architecture: only for device = "cuda"."""
    if spec.target.device == "cpu" and spec.target.arch is not None:
        yield problem(
            "target.arch",
            "a CPU target has no CUDA architecture",
            'remove it, or device = "cuda"',
            value=spec.target.arch,
        )


# --- size ---------------------------------------------------------------------------------


@rule("layer_fits_device")
def _fits_device(spec: Spec) -> Iterator[Problem]:
    """One rank's weights and the activations of a forward of max_num_tokens tokens fit the
    memory of the target device (the device table's; a CPU target has a ceiling no host
    exceeds). A lower bound: the plan's buffers come on top."""
    needed = memory.layer_bytes(spec, spec.target.max_num_tokens)
    device, available = memory.device_memory(spec)
    if needed.total <= available:
        return
    model = spec.model
    if needed.activations > needed.weights:
        key, value = "target.max_num_tokens", spec.target.max_num_tokens
        what = f"a forward of {value} tokens"
    else:
        key, value = "model", None
        what = (
            f"{model.n_routed_experts} experts of 3 x {model.hidden_size} x "
            f"{model.moe_intermediate_size} weights in {spec.quant.scheme}"
        )
    ranks = spec.parallel.tp_size * spec.parallel.ep_size
    per_rank = " per rank" if ranks > 1 else ""
    message = (
        f"the layer needs at least {memory.show_bytes(needed.total)}{per_rank} (weights "
        f"{memory.show_bytes(needed.weights)}, activations {memory.show_bytes(needed.activations)}"
        f"; {what}), more than {device}"
    )
    hint = "smaller dims or target.max_num_tokens, or more ranks with parallel.ep_size"
    if value is None:
        yield problem(key, message, hint)
    else:
        yield problem(key, message, hint, value=value)


@rule("gpu_needs_cuda")
def _gpu(spec: Spec) -> Iterator[Problem]:
    """target.gpu picks a tuned tile table for a CUDA GPU: only for device = "cuda"."""
    if spec.target.device == "cpu" and spec.target.gpu is not None:
        yield problem(
            "target.gpu",
            "a CPU target runs no tuned GPU tiles",
            'remove it, or device = "cuda"',
            value=spec.target.gpu,
        )


from moec.spec import deepep_rules  # noqa: E402, F401  (registers the DeepEP rules after these)
