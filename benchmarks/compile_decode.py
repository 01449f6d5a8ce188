"""A transformers DeepseekV3 model with moec's layer, compiled and CUDA-graph captured, beside eager.

The model takes the package's MoE dims and router (its SPEC) with V3's attention and `--layers`
layers (the first dense); every MoE block is replaced as moec.integrations.transformers does
(the block's own bf16 weights loaded into the package's MoELayer), written out here because the
GPU image has no moec. Each decode-shaped step is a forward of [B, 1] tokens without a cache
(B tokens through every MoE layer), timed three ways:
- eager;
- torch.compile(fullgraph=True, backend="cudagraphs"): Dynamo's graph, the layer one custom op,
  replayed as CUDA graphs; the same ops as eager, so the logits must equal eager's bit for bit;
- torch.compile(fullgraph=True, mode="reduce-overhead"): inductor around the op, CUDA graphs;
  inductor fuses the rest of the model in other orders, so its logits are reported as their
  largest difference from eager's, relative to eager's largest logit, and top-1 agreement.
Ends with one JSON line. A CPU dry run: MOEC_BENCH_DEVICE=cpu, a CPU package, --layers 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from common import DEVICE, import_package
from torch import nn


class Patched(nn.Module):
    """The MoE block's drop-in (moec.integrations.transformers.MoecMoE): [B, S, H] -> [B, S, H]."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        return self.layer(hidden_states.reshape(-1, shape[-1])).view(shape)


def model_for(package, layers: int, cpu_small: bool):
    """A DeepseekV3ForCausalLM with the package's MoE dims, its MoE blocks patched."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    spec = package.SPEC
    attention = (
        dict(num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=16,
             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, intermediate_size=96,
             vocab_size=64)
        if cpu_small
        else dict(num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536,
                  kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                  intermediate_size=18432, vocab_size=129280)
    )  # fmt: skip
    config = DeepseekV3Config(
        hidden_size=spec["model"]["hidden_size"],
        moe_intermediate_size=spec["model"]["moe_intermediate_size"],
        n_routed_experts=spec["model"]["n_routed_experts"],
        num_experts_per_tok=spec["model"]["num_experts_per_tok"],
        n_shared_experts=spec["model"]["n_shared_experts"],
        n_group=spec["router"]["n_group"],
        topk_group=spec["router"]["topk_group"],
        norm_topk_prob=spec["router"]["norm_topk_prob"],
        routed_scaling_factor=spec["router"]["routed_scaling_factor"],
        num_hidden_layers=layers,
        first_k_dense_replace=1,
        max_position_embeddings=4096,
        **attention,
    )
    dtype = getattr(torch, spec["target"]["dtype"])
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = DeepseekV3ForCausalLM(config).to(dtype).eval()
    for index in range(1, layers):
        block = model.model.layers[index].mlp
        # the router's correction bias: transformers initializes it to zeros, a checkpoint has one
        block.gate.e_score_correction_bias.normal_(0, 0.01)
        layer = package.MoELayer(device=DEVICE)
        layer.load_weights(block.state_dict())
        model.model.layers[index].mlp = Patched(layer)
        del block
        torch.cuda.empty_cache() if DEVICE == "cuda" else None
    return model


def step_ms(fn, tokens, iterations: int) -> float:
    """Median ms of one call of fn(tokens) (synchronized), after warm-up calls."""
    for _ in range(3):
        fn(tokens)
    times = []
    for _ in range(iterations):
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(tokens)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_triton")
    parser.add_argument("--layers", type=int, default=3, help="model layers, the first dense")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    package = import_package(args.package)
    model = model_for(package, args.layers, cpu_small=DEVICE == "cpu")
    vocab = model.config.vocab_size

    def eager(tokens):
        return model(tokens, use_cache=False).logits

    graphs = torch.compile(eager, fullgraph=True, backend="cudagraphs", dynamic=False)
    inductor = torch.compile(eager, fullgraph=True, mode="reduce-overhead", dynamic=False)
    rows = []
    with torch.no_grad():
        for batch in args.batch:
            tokens = torch.randint(0, vocab, (batch, 1), device=DEVICE)
            expected = eager(tokens).clone()
            captured = graphs(tokens).clone()
            fused = inductor(tokens).clone()
            if not torch.equal(captured, expected):
                raise SystemExit(f"B={batch}: the cudagraphs-compiled logits differ from eager's")
            scale = expected.float().abs().max().item()
            row = {
                "batch": batch,
                "eager_ms": step_ms(eager, tokens, args.iterations),
                "cudagraphs_ms": step_ms(graphs, tokens, args.iterations),
                "inductor_graphs_ms": step_ms(inductor, tokens, args.iterations),
                "inductor_max_diff_rel": (fused.float() - expected.float()).abs().max().item()
                / scale,
                "inductor_top1_agree": (fused.argmax(-1) == expected.argmax(-1))
                .float()
                .mean()
                .item(),
            }
            rows.append(row)
            print(
                f"B={batch:4d}  eager {row['eager_ms']:8.3f} ms  cudagraphs {row['cudagraphs_ms']:8.3f}"
                f" ms (equal)  inductor+graphs {row['inductor_graphs_ms']:8.3f} ms"
                f" (max diff {row['inductor_max_diff_rel']:.2e} of max, top-1"
                f" {row['inductor_top1_agree']:.3f})",
                flush=True,
            )
    skips = dict(torch._dynamo.utils.counters["inductor"])
    print(json.dumps({"package": args.package, "layers": args.layers, "rows": rows,
                      "inductor_counters": {k: v for k, v in skips.items() if "cudagraph" in k}}))  # fmt: skip


if __name__ == "__main__":
    main()
