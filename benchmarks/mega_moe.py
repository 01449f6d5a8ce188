"""The SGLang fork of DeepGEMM's fused SM90 MoE kernel on one GPU, beside moec's layer (issue 27).

`fp8_mega_moe` (sgl-project/DeepGEMM, pull request 24 at 805f7e8: "MegaMOE adaptation for SM90",
a DeepGEMM 2.5.0 tree) runs the routed experts of a layer as one persistent kernel: each token's
rows to its experts, the gate/up GEMM with SwiGLU and the intermediate's e4m3 quantization in its
epilogue, the down GEMM and the weighted sum back to the tokens. Its operands are DeepSeek-V3's
fp8 format (e4m3 weights with fp32 scales per 128 x 128 block, tokens per 1 x 128 group); its
intermediate takes fp32 scales per 1 x 64 group, which moec's fp8_block scheme does not.

The fork is built from source on the GPU (benchmarks/stage_sgl_deep_gemm.sh stages it here,
prefill_session.sh builds it) and imported as `sgl_deep_gemm`, beside the DeepGEMM that moec's
layer runs on (`deep_gemm`, 2.6.1): the two are different versions of one library.

For each T the probe routes a random input with moec's layer (its `select` stage), then times:
  moec       moec's whole layer (the built package, `gemm_backend = "auto"`);
  routed     the fused kernel with its inputs written into its buffer (x to e4m3 per 1 x 128
             group in torch, the choices copied), as the fork's own benchmark does;
  kernel     the fused kernel alone, on inputs written once;
  shared     the shared expert as DeepGEMM's two dense fp8 GEMMs and a torch activation;
  fused      route + routed + shared: a whole layer on the fused kernel;
each in a CUDA graph where capture works, in turn for ROUNDS rounds, and each output against the
torch backend's (the project's reference) on the same weights. Needs torch.distributed with one
rank (the kernel's buffer is symmetric memory).

    python benchmarks/mega_moe.py --tokens 2048,4096,16384 --out $OUT/mega_moe.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import traceback
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from common import dump, graphed, import_package, in_turn, route
from prefill_ab import errors

from moec.runtime import quant

ROUNDS = 3
GROUP = 128  # the tokens' and the shared intermediate's quantization group


class FusedLayer:
    """A DeepSeek-V3 layer on the fused kernel: moec's router and select, the routed experts in
    fp8_mega_moe, the shared expert in DeepGEMM's dense fp8 GEMMs, all on moec's weights."""

    def __init__(
        self, fused_lib, deep_gemm, package, layer, group, max_tokens: int, fast_math: bool
    ):
        dims = package.PLAN["choices"]["dims"]
        self.fused_lib, self.dg, self.package, self.layer = fused_lib, deep_gemm, package, layer
        self.experts, self.top_k = dims["routed_experts"], dims["top_k"]
        self.hidden, self.inter = dims["hidden"], dims["intermediate"]
        self.fast_math = fast_math
        e = self.experts
        l1 = (layer.w13[:e], layer.w13_scale[:e])
        l2 = (layer.w2[:e], layer.w2_scale[:e])
        self.l1, self.l2 = fused_lib.transform_weights_for_mega_moe_sm90(l1, l2)
        self.shared13 = (layer.w13[e], layer.w13_scale[e])
        self.shared2 = (layer.w2[e], layer.w2_scale[e])
        self.buffer = fused_lib.get_symm_buffer_for_mega_moe(
            group, e, max_tokens, self.top_k, self.hidden, self.inter
        )
        self.outputs: dict[int, tuple[torch.Tensor, ...]] = {}

    def _out(self, tokens: int):
        if tokens not in self.outputs:
            new = partial(torch.empty, dtype=torch.bfloat16, device="cuda")
            self.outputs[tokens] = (
                new(tokens, self.hidden),
                new(tokens, 2 * self.inter),
                new(tokens, self.hidden),
            )
        return self.outputs[tokens]

    def choices(self, x):
        weights, ids = route(self.package, self.layer, x)
        k = self.top_k
        return weights[:, :k].float().contiguous(), ids[:, :k].to(torch.int64).contiguous()

    def routed(self, x, weights, ids):
        tokens = x.shape[0]
        b = self.buffer
        xq, x_scale = quant.quantize_blocks(x, 1, GROUP, pow2_scales=False)
        b.x[:tokens].copy_(xq)
        b.x_sf[:tokens].copy_(x_scale)
        b.topk_idx[:tokens].copy_(ids)
        b.topk_weights[:tokens].copy_(weights)
        return self.kernel(tokens)

    def kernel(self, tokens: int):
        """The fused kernel alone, on the inputs routed() last wrote into its buffer."""
        y = self._out(tokens)[0]
        self.fused_lib.fp8_mega_moe(
            y, self.l1, self.l2, self.buffer, recipe=(128, 128, 128), activation="swiglu",
            fast_math=self.fast_math,
        )  # fmt: skip
        return y

    def shared(self, x):
        tokens = x.shape[0]
        _, h, out = self._out(tokens)
        a = (self.buffer.x[:tokens], self.buffer.x_sf[:tokens])  # routed()'s e4m3 of x
        self.dg.fp8_gemm_nt(a, self.shared13, h)
        gate, up = h[:, : self.inter].float(), h[:, self.inter :].float()
        act = quant.quantize_blocks(gate * torch.sigmoid(gate) * up, 1, GROUP, pow2_scales=False)
        self.dg.fp8_gemm_nt(act, self.shared2, out)
        return out

    def __call__(self, x):
        weights, ids = self.choices(x)
        routed = self.routed(x, weights, ids)
        return routed + self.shared(x)


def replay(fn, label: str, failures: dict):
    try:
        return graphed(fn)
    except Exception as failure:  # time it eagerly, say why
        failures[label] = f"CUDA graph capture failed: {failure!r}"[:300]
        return fn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="bench_v3_fp8_auto")
    parser.add_argument("--reference", default="bench_v3_fp8_torch")
    parser.add_argument("--tokens", default="1,64,512,2048,4096,8192,16384")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--fast-math", type=int, default=0, help="the kernel's fast_math")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import deep_gemm
    import sgl_deep_gemm

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    group = dist.new_group([0])
    tokens_list = [int(t) for t in args.tokens.split(",")]
    package = import_package(args.package)
    layer = package.MoELayer(device="cuda").random_(0)
    start = time.time()
    fused = FusedLayer(
        sgl_deep_gemm, deep_gemm, package, layer, group, max(tokens_list), bool(args.fast_math)
    )
    print(f"fused kernel's weights and buffer: {time.time() - start:.1f} s, "
          f"buffer {fused.buffer.buffer.numel() / 2**30:.2f} GiB")  # fmt: skip
    reference = import_package(args.reference)
    reference_layer = reference.MoELayer(device="cuda").random_(0)
    result = {
        "package": args.package,
        "reference": args.reference,
        "fast_math": bool(args.fast_math),
        "deep_gemm": getattr(deep_gemm, "__version__", "?"),
        "sgl_deep_gemm": getattr(sgl_deep_gemm, "__version__", "?"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": [],
    }
    for tokens in tokens_list:
        start = time.time()
        row: dict = {"tokens": tokens, "failures": {}}
        try:
            x = torch.randn(tokens, fused.hidden, device="cuda").bfloat16()
            expected = reference_layer(x)
            weights, ids = fused.choices(x)
            ours = layer(x)
            theirs = fused(x)
            row["moec_errors"] = errors(ours, expected)
            row["fused_errors"] = errors(theirs, expected)
            gap = (theirs.float() - ours.float()).abs().max() / ours.float().abs().max()
            row["fused_gap_to_moec"] = float(gap)
            del expected, ours, theirs
            replays = {
                "moec": replay(partial(layer, x), "moec", row["failures"]),
                "routed": replay(partial(fused.routed, x, weights, ids), "routed", row["failures"]),
                "kernel": replay(partial(fused.kernel, tokens), "kernel", row["failures"]),
                "shared": replay(partial(fused.shared, x), "shared", row["failures"]),
                "fused": replay(partial(fused, x), "fused", row["failures"]),
            }
            for name, samples in in_turn(replays, args.rounds).items():
                row[f"{name}_ms"] = round(statistics.median(samples), 4)
            replays.clear()
            # the kernel alone is timed on inputs written once: valid only if it leaves them whole
            again = fused.kernel(tokens).float()
            routed = fused.routed(x, weights, ids).float()
            row["kernel_repeat_gap"] = float((again - routed).abs().max() / routed.abs().max())
        except Exception:
            row["failures"]["run"] = traceback.format_exc()[-1500:]
        torch.cuda.empty_cache()
        result["rows"].append(row)
        dump(Path(args.out), result)  # after every T, so that a run cut short keeps its rows
        times = "  ".join(f"{n} {row[f'{n}_ms']}" for n in ("moec", "routed", "kernel", "shared", "fused")
                          if f"{n}_ms" in row)  # fmt: skip
        print(f"T={tokens}: {times} ms ({time.time() - start:.0f} s)")
        for key in ("moec_errors", "fused_errors", "fused_gap_to_moec", "kernel_repeat_gap"):
            if key in row:
                print(f"    {key}: {row[key]}")
        for label, failure in row["failures"].items():
            print(f"    {label}: {failure}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
