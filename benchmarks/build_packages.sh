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
