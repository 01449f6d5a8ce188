#!/usr/bin/env bash
# One device call: tune the GEMM tiles, then time the layers. Run from the repo root on the GPU
# with benchmarks/.packages carried (./benchmarks/build_packages.sh builds it here).
#   STEP=tune  -> $OUT/h200.json (+ .log.json)
#   STEP=bench -> $OUT/bench_*.json, using TUNED (default moec/plan/tuned/h200.json)
set -uo pipefail
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
case "${STEP:-bench}" in
  all)
    python3 tune.py --out "$OUT/h200.json" --schemes "${SCHEMES:-fp8_block,bf16}" 2>&1 | tee "$OUT/tune.log"
    for scheme in ${BENCH:-fp8_block bf16 fp8_block_fused}; do
      python3 bench_moe.py --scheme "$scheme" --tuned "$OUT/h200.json" --out "$OUT/bench_$scheme.json" 2>&1 | tee "$OUT/bench_$scheme.log"
    done
    ;;
  tune)
    python3 tune.py --out "$OUT/h200.json" --schemes "${SCHEMES:-fp8_block,bf16}" 2>&1 | tee "$OUT/tune.log"
    ;;
  bench)
    TUNED=${TUNED:-../moec/plan/tuned/h200.json}
    for scheme in ${SCHEMES:-fp8_block bf16 fp8_block_fused}; do
      python3 bench_moe.py --scheme "$scheme" --tuned "$TUNED" --out "$OUT/bench_$scheme.json" 2>&1 | tee "$OUT/bench_$scheme.log"
    done
    for scheme in ${SMALL:-mxfp8 mxfp4}; do
      python3 bench_moe.py --scheme "$scheme" --tokens 1,64,1024 --out "$OUT/bench_$scheme.json" 2>&1 | tee "$OUT/bench_$scheme.log"
    done
    ;;
esac
