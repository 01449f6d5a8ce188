#!/usr/bin/env bash
# One device call: the native kernel and layer tests of TESTS (`make gpu-test`, 4 processes), then
# ab_layers.py for each before,after package pair of PAIRS (built here beforehand, carried in
# benchmarks/.packages; see ab_layers.py for building the "before" side from an earlier commit).
#   TESTS="tests/kernel_tests/test_gate.py tests/gpu/test_layer.py" SKIP="shipped_tuned" \
#   PAIRS="bench_v3_fp8_before,bench_v3_fp8_triton" TOKENS=1,16,1024 bash benchmarks/ab_session.sh
# SKIP / ONLY: pytest -k expressions to leave out / to keep; DIST: xdist's distribution of the
# kernel tests (default load, test by test; loadfile keeps each file in one process); tests/gpu always
# runs in one process (make gpu-test), as each of its tests holds DeepSeek-V3 layers (run 70).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
if [ -n "${TESTS:-}" ]; then
  selected="${SKIP:+-k \"not ($SKIP)\"}${ONLY:+ -k \"$ONLY\"}"
  timeout "${TEST_SECONDS:-330}" make gpu-test PY=python3 GPU_WORKERS=4 \
    GPU_DIST="${DIST:-load}" GPU_TESTS="$TESTS" GPU_ARGS="$selected" > "$OUT/tests.txt" 2>&1
  echo "tests: exit $?"; tail -4 "$OUT/tests.txt"
fi
cd benchmarks
for pair in ${PAIRS:-}; do
  name=${pair##*,}
  python3 ab_layers.py --packages "$pair" --stage "${STAGE:-select}" --tokens "${TOKENS:-1,16,1024}" \
    --rounds "${ROUNDS:-5}" --out "$OUT/ab_$name.json" > "$OUT/ab_$name.txt" 2>&1
  echo "$pair: exit $?"; grep -o "{'tokens'.*" "$OUT/ab_$name.txt" | cut -c1-400
done
