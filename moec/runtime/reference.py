"""The whole layer in torch ops, from a MoELayer's parameters and its plan.json: what
`python -m <package>.check` compares the layer with.

It composes the torch runtime functions (torch_select, torch_matmul) itself, assignment by
assignment, without the package's stages, as docs/numerics.md defines the layer: router logits
in fp32 (rounded to the model dtype as the select stage's `rounding` says); top-k selection;
activations quantized as the scheme says; GEMMs accumulated in fp32 over the dequantized
operands and rounded once to the model dtype; the gated activation in fp32;
the combine in fp32 over the k assignments (fused shared experts are assignments of weight 1),
plus a separate shared MLP's output, rounded once. One rank only.

Shapes: T tokens, H hidden, I intermediate, K assignments per token (top-k plus fused shared
experts), A = T * K assignments.
"""

import functools

import torch
import torch.nn.functional as F

from . import torch_matmul, torch_select


def forward(layer, x: torch.Tensor, plan: dict, torch_gated, token_ids=None) -> torch.Tensor:
    """out [T, H] in x's dtype: the layer's math on its own parameters. `plan` is the package's
    PLAN, `torch_gated` its gated activation (gated_activation.torch_gated); `token_ids` [T]
    the hash table's keys, for a hash-routed layer."""
    dims = plan["choices"]["dims"]
    params = dict(layer.named_parameters())
    weights, ids = select(x, params, plan, token_ids)  # [T, K] fp32, [T, K] int32
    tokens, top_k = ids.shape
    rows = expert_rows(x, ids, params, dims["routed"], dims["intermediate"], torch_gated)
    rows = rows.view(tokens, top_k, x.shape[1])  # [T, K, H] (-1 is ambiguous at T = 0)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for k in range(top_k):
        out += weights[:, k : k + 1] * rows[:, k].float()
    if dims["n_shared"] and not dims["fused_shared"]:
        shared = shared_mlp(x, params, dims["shared"], dims["shared_intermediate"], torch_gated)
        out += shared.float()
    return out.to(x.dtype)


SELECT_OPTIONS = (
    "scoring_func",
    "topk_method",
    "n_group",
    "topk_group",
    "top_k",
    "norm_topk_prob",
    "routed_scaling_factor",
    "fused_shared",
    "rounding",
)
"""The select stage's choices (plan.json) that torch_select.select_topk takes (and round_to,
the model dtype)."""
HASH_OPTIONS = (
    "scoring_func",
    "norm_topk_prob",
    "routed_scaling_factor",
    "fused_shared",
    "rounding",
)
"""Those torch_select.select_hash takes."""


def token_ids_for(plan: dict, x: torch.Tensor, generator: torch.Generator):
    """Random token ids [T] for x when the layer is hash-routed (its forward takes them), else
    None."""
    vocab = plan["choices"]["dims"].get("vocab", 0)
    if not vocab:
        return None
    return torch.randint(0, vocab, (x.shape[0],), generator=generator).to(x.device)


def select(x: torch.Tensor, params: dict, plan: dict, token_ids=None):
    """(topk_weights [T, K] fp32, topk_ids [T, K] int32) from fp32 router logits [T, E]."""
    (options,) = [s["choices"] for s in plan["stages"] if s["kind"] == "select"]
    options = {key: options[key] for key in SELECT_OPTIONS}
    options["round_to"] = x.dtype
    if options["topk_method"] == "hash":
        hashed = {key: options[key] for key in (*HASH_OPTIONS, "round_to")}
        logits = F.linear(x.float(), params["gate_weight"])
        return torch_select.select_hash(logits, token_ids, params["tid2eid"], **hashed)
    if "gate_weight" in params:
        gate = params["gate_weight"]  # [E, H] fp32
    else:  # the three bf16 parts of the fp32 weight (the bf16 x 3 router)
        gate = params["gate_parts"].float().sum(dim=0)
    logits = F.linear(x.float(), gate)  # [T, E]
    return torch_select.select_topk(logits, params.get("gate_bias"), **options)


def quantizer(fmt: dict, dtype: torch.dtype):
    """(values, static scale or None) -> (activations, scales or None) in format `fmt`
    (plan.json's dims.routed / dims.shared): unquantized formats round to the model dtype."""
    if fmt["scheme"] == "bf16":
        return lambda values, scale: (values.to(dtype), None)
    if fmt["static"]:
        return torch_matmul.quantize_static
    if fmt["group"] is None:
        return lambda values, scale: torch_matmul.quantize_per_tensor(values)
    quantize = functools.partial(
        torch_matmul.quantize_groups, group=fmt["group"], pow2_scales=fmt["pow2_scales"]
    )
    return lambda values, scale: quantize(values)


def matmul(fmt: dict, dtype: torch.dtype):
    """(a, a_scale, w [N, K], w_scale) -> [rows, N] in `dtype`, for format `fmt`."""
    if fmt["scheme"] == "bf16":
        function = torch_matmul.matmul_bf16
    elif fmt["scheme"] == "fp8_per_tensor":
        function = torch_matmul.matmul_fp8_per_tensor
    elif fmt["scheme"] == "mxfp4":
        function = torch_matmul.matmul_mxfp4
    else:
        block = tuple(fmt["weight_block"])
        function = functools.partial(
            torch_matmul.matmul_block_scaled, group=fmt["group"], block=block
        )
    return functools.partial(function, out_dtype=dtype)


def expert_rows(x, ids, params: dict, fmt: dict, intermediate: int, torch_gated):
    """The expert MLP of every assignment: [A, H] in x's dtype, assignments token by token."""
    tokens = torch.arange(ids.shape[0], device=x.device).repeat_interleave(ids.shape[1])  # [A]
    experts = ids.reshape(-1).long()  # [A]
    quantize, multiply = quantizer(fmt, x.dtype), matmul(fmt, x.dtype)
    a, a_scale = quantize(x, params.get("w13_input_scale"))  # [T, H]
    a, a_scale = a[tokens], _rows_of(a_scale, tokens)  # [A, H]
    h = _grouped(a, a_scale, experts, params["w13"], params.get("w13_scale"), multiply, x.dtype)
    act = torch_gated(h[:, :intermediate].float(), h[:, intermediate:].float())  # [A, I]
    g, g_scale = quantize(act, params.get("w2_input_scale"))
    return _grouped(g, g_scale, experts, params["w2"], params.get("w2_scale"), multiply, x.dtype)


def shared_mlp(x, params: dict, fmt: dict, intermediate: int, torch_gated) -> torch.Tensor:
    """The shared experts as one dense gated MLP: [T, H] in x's dtype."""
    quantize, multiply = quantizer(fmt, x.dtype), matmul(fmt, x.dtype)
    a, a_scale = quantize(x, params.get("shared_w13_input_scale"))
    h = multiply(a, a_scale, params["shared_w13"], params.get("shared_w13_scale"))  # [T, 2Is]
    act = torch_gated(h[:, :intermediate].float(), h[:, intermediate:].float())
    g, g_scale = quantize(act, params.get("shared_w2_input_scale"))
    return multiply(g, g_scale, params["shared_w2"], params.get("shared_w2_scale"))


def _rows_of(scale, rows):
    """Per-row scales [T, G] follow their rows; a per-tensor scale [1] (or None) stays."""
    return scale[rows] if scale is not None and scale.dim() == 2 else scale


def _grouped(a, a_scale, experts, w, w_scale, multiply, dtype) -> torch.Tensor:
    """Each assignment's row times its expert's weight: [A, N] in `dtype`."""
    out = torch.empty((a.shape[0], w.shape[1]), dtype=dtype, device=a.device)
    for expert in experts.unique().tolist():
        rows = (experts == expert).nonzero().flatten()
        scale = None if w_scale is None else w_scale[expert]
        out[rows] = multiply(a[rows], _rows_of(a_scale, rows), w[expert], scale)
    return out
