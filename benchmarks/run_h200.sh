#!/usr/bin/env bash
# One device call: tune the GEMM tiles, then time the layers. Run from the repo root on the GPU
# with benchmarks/.packages carried (./benchmarks/build_packages.sh builds it here) and, for the
# tune step, .whl (moec's own dependencies as wheels, as gpu_session.sh installs them).
#   STEP=tune  -> $OUT/h200.json (`moec tune` of the V3 layer per scheme, one table)
#   STEP=bench -> $OUT/bench_*.json, using TUNED (default moec/plan/tuned/h200.json)
set -uo pipefail
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

tune() {  # moec tune, each scheme's entries merged into one table
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site ../.whl/*.whl || return 1
  for scheme in ${SCHEMES:-fp8_block bf16}; do
    (cd .. && PYTHONPATH=/tmp/site:$PWD python3 -m moec tune benchmarks/specs/v3.toml \
      --set quant.scheme="$scheme" -o "$OUT/h200.json") 2>&1 | tee -a "$OUT/tune.log"
  done
}

case "${STEP:-bench}" in
  all)
    tune
    for scheme in ${BENCH:-fp8_block bf16 fp8_block_fused}; do
      python3 bench_moe.py --scheme "$scheme" --tuned "$OUT/h200.json" --out "$OUT/bench_$scheme.json" 2>&1 | tee "$OUT/bench_$scheme.log"
    done
    ;;
  tune)
    tune
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
