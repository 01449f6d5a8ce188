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
