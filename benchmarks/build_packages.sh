#!/usr/bin/env bash
# Build the packages the GPU benchmarks import into benchmarks/.packages (carried to the GPU,
# whose image has torch and triton but not moec's own dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
MOEC=${MOEC:-.venv/bin/moec}
OUT=benchmarks/.packages
mkdir -p "$OUT"
for backend in triton torch; do
  $MOEC build benchmarks/specs/v3.toml -o "$OUT" --set name=bench_v3_fp8_$backend \
    --set quant.scheme=fp8_block --set experts.gemm_backend=$backend
  $MOEC build benchmarks/specs/v3.toml -o "$OUT" --set name=bench_v3_fp8sep_$backend \
    --set quant.scheme=fp8_block --set experts.gemm_backend=$backend --set experts.shared_experts=separate
  $MOEC build benchmarks/specs/v3.toml -o "$OUT" --set name=bench_v3_fp8ovl_$backend \
    --set quant.scheme=fp8_block --set experts.gemm_backend=$backend --set experts.shared_experts=overlapped
  $MOEC build benchmarks/specs/v3.toml -o "$OUT" --set name=bench_v3_bf16_$backend \
    --set quant.scheme=bf16 --set experts.gemm_backend=$backend
  $MOEC build benchmarks/specs/v2-lite.toml -o "$OUT" --set name=bench_v2lite_fp8_$backend \
    --set quant.scheme=fp8_block --set experts.gemm_backend=$backend
  $MOEC build benchmarks/specs/v2-lite.toml -o "$OUT" --set name=bench_v2lite_fp8ovl_$backend \
    --set quant.scheme=fp8_block --set experts.gemm_backend=$backend --set experts.shared_experts=overlapped
  $MOEC build benchmarks/specs/small.toml -o "$OUT" --set name=bench_small_mxfp8_$backend \
    --set quant.scheme=mxfp8 --set quant.checkpoint=bf16 --set experts.gemm_backend=$backend
  $MOEC build benchmarks/specs/small.toml -o "$OUT" --set name=bench_small_mxfp4_$backend \
    --set quant.scheme=mxfp4 --set quant.checkpoint=quantized --set experts.gemm_backend=$backend
done
# DeepGEMM layers (contiguous: DeepGEMM's prefill layout), built where deep_gemm is importable
if $MOEC validate benchmarks/specs/v3.toml --set experts.gemm_backend=deep_gemm >/dev/null 2>&1; then
  $MOEC build benchmarks/specs/v3.toml -o "$OUT" --set name=bench_v3_fp8_deep_gemm \
    --set quant.scheme=fp8_block --set experts.gemm_backend=deep_gemm --set experts.layout=contiguous
  $MOEC build benchmarks/specs/v3.toml -o "$OUT" --set name=bench_v3_bf16_deep_gemm \
    --set quant.scheme=bf16 --set experts.gemm_backend=deep_gemm --set experts.layout=contiguous
  # gemm_backend auto: Triton or DeepGEMM per token bucket, from the times in the tuned table
  $MOEC build benchmarks/specs/v3.toml -o "$OUT" --set name=bench_v3_fp8_auto \
    --set quant.scheme=fp8_block --set experts.gemm_backend=auto --set experts.layout=contiguous
  $MOEC build benchmarks/specs/v3.toml -o "$OUT" --set name=bench_v3_bf16_auto \
    --set quant.scheme=bf16 --set experts.gemm_backend=auto --set experts.layout=contiguous
fi
# Two-GPU layers (benchmarks/bench_parallel.py): expert parallel over all2all (NCCL) and tensor
# parallel, fp8_block Triton; DeepEP normal and low-latency where deep_ep is importable.
v3_fp8=(benchmarks/specs/v3.toml -o "$OUT" --set quant.scheme=fp8_block)
$MOEC build "${v3_fp8[@]}" --set name=bench_v3_fp8_ep2_all2all_triton --set parallel.ep_size=2 \
  --set parallel.dispatch=all2all --set experts.gemm_backend=triton
$MOEC build "${v3_fp8[@]}" --set name=bench_v3_fp8ovl_ep2_all2all_triton --set parallel.ep_size=2 \
  --set parallel.dispatch=all2all --set experts.gemm_backend=triton \
  --set experts.shared_experts=overlapped
# one GPU holding one EP=2 rank's half of the experts (the same GEMM work per token as that rank)
$MOEC build "${v3_fp8[@]}" --set name=bench_v3half_fp8_triton --set model.n_routed_experts=128 \
  --set experts.shared_experts=separate --set experts.gemm_backend=triton
$MOEC build "${v3_fp8[@]}" --set name=bench_v3_fp8_tp2_triton --set parallel.tp_size=2 \
  --set experts.gemm_backend=triton --set experts.layout=contiguous
if $MOEC validate benchmarks/specs/v3.toml --set parallel.ep_size=2 \
  --set parallel.dispatch=deepep_normal >/dev/null 2>&1; then
  $MOEC build "${v3_fp8[@]}" --set name=bench_v3_fp8_ep2_all2all_deep_gemm --set parallel.ep_size=2 \
    --set parallel.dispatch=all2all --set experts.gemm_backend=deep_gemm --set experts.layout=contiguous
  for backend in triton deep_gemm; do
    $MOEC build "${v3_fp8[@]}" --set name=bench_v3_fp8_ep2_normal_$backend --set parallel.ep_size=2 \
      --set parallel.dispatch=deepep_normal --set experts.gemm_backend=$backend \
      --set experts.layout=contiguous --set parallel.max_tokens_per_rank=4096 \
      --set target.max_num_tokens=4096
    $MOEC build "${v3_fp8[@]}" --set name=bench_v3_fp8_ep2_ll_$backend --set parallel.ep_size=2 \
      --set parallel.dispatch=deepep_low_latency --set experts.gemm_backend=$backend \
      --set parallel.max_tokens_per_rank=128 --set target.max_num_tokens=128 --set experts.layout=masked
  done
fi
