"""DeepSeek-V3 layer specs of the GPU suite (hidden 7168, intermediate 2048, 256 experts, top-8,
one shared expert, sigmoid noaux_tc routing over 8 groups keeping 4)."""

V3 = """
name = "gpu_v3"
[model]
preset = "deepseek-v3"
[target]
device = "cuda"
arch = "sm90"
max_num_tokens = 8192
"""
HIDDEN = 7168

SCHEMES = {
    "fp8_block": ["quant.scheme=fp8_block", "quant.checkpoint=bf16"],
    "bf16": ["quant.scheme=bf16"],
}


def norm_error(out, expected) -> float:
    """Norm-wise relative error, in float64."""
    out, expected = out.double(), expected.double()
    return ((out - expected).norm() / expected.norm()).item()


SMALL = """
name = "gpu_small"
[model]
hidden_size = 1024
moe_intermediate_size = 512
n_routed_experts = 32
num_experts_per_tok = 4
n_shared_experts = 1
[router]
scoring_func = "sigmoid"
topk_method = "noaux_tc"
n_group = 4
topk_group = 2
norm_topk_prob = true
routed_scaling_factor = 2.5
[experts]
layout = "contiguous"
[target]
device = "cuda"
arch = "sm90"
max_num_tokens = 4096
"""
"""A smaller layer (hidden 1024, 32 experts, top-4): its scheme comes from overrides."""
SMALL_HIDDEN = 1024
