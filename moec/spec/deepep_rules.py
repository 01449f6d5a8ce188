"""Rules of DeepEP dispatch (parallel.dispatch = "deepep_normal" / "deepep_low_latency"): what
DeepEP V1's kernels take (deepseek-ai/DeepEP 29d31c0: csrc/kernels/launch.cuh, deep_ep/buffer.py;
moec/plan/deepep.py sizes its buffers)."""

from __future__ import annotations

from collections.abc import Iterator

from moec.errors import Problem, problem
from moec.spec.models import Spec
from moec.spec.rules import DEEPEP, arch_number, rule

LOW_LATENCY_HIDDEN = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)
"""Hidden sizes DeepEP's low-latency kernels are compiled for (SWITCH_HIDDEN)."""
LOW_LATENCY_MAX_TOP_K = 11
"""Most top-k entries per token the low-latency kernels take."""
LOW_LATENCY_MAX_TOKENS = 1024
"""moec's bound on max_tokens_per_rank (NVSHMEM's queue depth grows with it)."""
NORMAL_RANKS = (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160)
"""EP sizes DeepEP has a tuned normal-mode config for (Buffer.get_dispatch_config)."""
NVL_PEERS = 8
"""GPUs one node connects by NVLink (DeepEP's NUM_MAX_NVL_PEERS)."""


@rule("deepep_target")
def _deepep(spec: Spec) -> Iterator[Problem]:
    """DeepEP runs on CUDA (NVSHMEM), sm90 or newer, and exchanges bf16 token rows."""
    if spec.parallel.dispatch not in DEEPEP:
        return
    if spec.target.device != "cuda" or arch_number(spec) < 90:
        yield problem(
            "parallel.dispatch",
            "DeepEP needs a CUDA target of sm90 or newer",
            'target.device = "cuda", or dispatch = "all2all"',
            value=spec.parallel.dispatch,
        )
    if spec.target.dtype != "bfloat16":
        yield problem(
            "target.dtype",
            f"DeepEP exchanges bf16 (or e4m3) token rows, not {spec.target.dtype}",
            '"bfloat16", or dispatch = "all2all"',
            value=spec.target.dtype,
        )


@rule("deepep_activation_format")
def _deepep_format(spec: Spec) -> Iterator[Problem]:
    """DeepEP carries bf16 rows, or e4m3 rows with one fp32 scale per 1 x 128 group (the
    low-latency kernels quantize to exactly that): the bf16 and fp8_block schemes."""
    scheme = spec.quant.scheme
    if spec.parallel.dispatch in DEEPEP and scheme not in ("bf16", "fp8_block"):
        yield problem(
            "quant.scheme",
            f"DeepEP sends bf16 or e4m3 rows with 1 x 128 fp32 scales; {scheme} activations "
            "are neither",
            '"fp8_block" or "bf16", or dispatch = "all2all"',
            value=scheme,
        )


@rule("deepep_normal_ranks")
def _normal_ranks(spec: Spec) -> Iterator[Problem]:
    """DeepEP's normal kernels run on 2, 4 or 8 ranks of one node, or on whole nodes of 8
    (16 .. 160 ranks, the sizes it has configs for)."""
    parallel = spec.parallel
    if parallel.dispatch != "deepep_normal":
        return
    if parallel.ep_size not in NORMAL_RANKS:
        yield problem(
            "parallel.ep_size",
            "DeepEP's normal dispatch has no config for this many ranks",
            f'one of {", ".join(map(str, NORMAL_RANKS))}, or dispatch = "all2all"',
            value=parallel.ep_size,
        )
    elif parallel.ep_size > NVL_PEERS and parallel.ep_size // parallel.nodes != NVL_PEERS:
        yield problem(
            "parallel.nodes",
            f"DeepEP's internode kernels take nodes of {NVL_PEERS} GPUs: ep_size = "
            f"{parallel.ep_size} needs {parallel.ep_size // NVL_PEERS} nodes",
            f"{parallel.ep_size // NVL_PEERS}",
            value=parallel.nodes,
        )


@rule("low_latency_needs_masked_and_bound")
def _low_latency(spec: Spec) -> Iterator[Problem]:
    """DeepEP low-latency dispatch writes [E_local, ep_size * max_tokens_per_rank, H] buffers:
    it needs the masked layout, a per-rank token bound (at most 1024, ep_size times it a
    multiple of 4) and max_num_tokens within that bound."""
    parallel = spec.parallel
    if parallel.dispatch != "deepep_low_latency":
        return
    if spec.experts.layout == "contiguous":
        yield problem(
            "experts.layout",
            "low-latency dispatch delivers tokens in the masked layout",
            '"masked" or "auto"',
            value="contiguous",
        )
    bound = parallel.max_tokens_per_rank
    if bound is None:
        yield problem(
            "parallel.max_tokens_per_rank",
            "low-latency dispatch needs the per-rank token bound",
            "e.g. 128 (decode batch per rank)",
        )
        return
    if bound > LOW_LATENCY_MAX_TOKENS:
        yield problem(
            "parallel.max_tokens_per_rank",
            "exceeds DeepEP low-latency's bound",
            f"at most {LOW_LATENCY_MAX_TOKENS}",
            value=bound,
        )
    if bound * parallel.ep_size % 4:
        yield problem(
            "parallel.max_tokens_per_rank",
            f"DeepEP needs ep_size x max_tokens_per_rank = {bound * parallel.ep_size} to be a "
            "multiple of 4",
            f"e.g. {-(-bound // 4) * 4}",
            value=bound,
        )
    if spec.target.max_num_tokens > bound:
        yield problem(
            "target.max_num_tokens",
            f"exceeds the low-latency bound max_tokens_per_rank = {bound}",
            f"at most {bound}",
            value=spec.target.max_num_tokens,
        )


@rule("low_latency_kernel_shapes")
def _low_latency_shapes(spec: Spec) -> Iterator[Problem]:
    """DeepEP's low-latency kernels are compiled for a fixed set of hidden sizes and at most 11
    top-k experts per token."""
    if spec.parallel.dispatch != "deepep_low_latency":
        return
    hidden = spec.model.hidden_size
    if hidden not in LOW_LATENCY_HIDDEN:
        yield problem(
            "model.hidden_size",
            "DeepEP's low-latency kernels are not compiled for this hidden size",
            f'one of {", ".join(map(str, LOW_LATENCY_HIDDEN))}, or dispatch = "deepep_normal"',
            value=hidden,
        )
    top_k = spec.model.num_experts_per_tok
    if top_k > LOW_LATENCY_MAX_TOP_K:
        yield problem(
            "model.num_experts_per_tok",
            f"DeepEP's low-latency kernels take at most {LOW_LATENCY_MAX_TOP_K} experts per token",
            f'at most {LOW_LATENCY_MAX_TOP_K}, or dispatch = "deepep_normal"',
            value=top_k,
        )


@rule("normal_dispatch_needs_contiguous")
def _normal(spec: Spec) -> Iterator[Problem]:
    """DeepEP normal dispatch delivers a data-dependent number of tokens per rank, which the
    contiguous layout packs; the masked layout would need the worst case per expert."""
    if spec.parallel.dispatch == "deepep_normal" and spec.experts.layout == "masked":
        yield problem(
            "experts.layout",
            "DeepEP normal dispatch feeds the contiguous layout",
            '"contiguous" or "auto", or dispatch = "deepep_low_latency"',
            value="masked",
        )
