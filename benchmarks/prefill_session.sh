#!/usr/bin/env bash
# One device call for the prefill work (issue 27), from the repo root, carrying .whl, .deps/src
# (and .deps/jit-cache.tgz from an earlier call, if any) and benchmarks/.packages (built here
# beforehand, the DeepGEMM ones with tests/stand_ins on PYTHONPATH: the generated code is the
# same). DeepGEMM builds (scripts/build_deps.sh) while the kernel tests of KERNEL_TESTS run;
# then prefill_ab.py for each run of RUNS ("label:package,...:reference:tokens", in turn), then
# the tests of LAYER_TESTS (one process: they hold whole layers). Everything lands in $OUT.
# PROFILE=1: each run's kernels at its largest T; ROUNDS: prefill_ab's rounds (default 3).
# PROBES: other scripts of benchmarks/ with their arguments, separated by ";", each run there
# after the prefill runs (output in $OUT/probe_N.log; a script's --out is its own). SGL_PROBE: one
# such script run first, with the SGLang fork of DeepGEMM (staged at .deps/src/sgl-DeepGEMM by
# stage_sgl_deep_gemm.sh, built here beside DeepGEMM) importable as `sgl_deep_gemm`.
#   RUNS="fp8:bench_v3_fp8_dg_before,bench_v3_fp8_deep_gemm:bench_v3_fp8_torch:2048,4096" \
#   KERNEL_TESTS="tests/kernel_tests/test_route.py" LAYER_TESTS="tests/gpu/test_deep_gemm.py" \
#   bash benchmarks/prefill_session.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
start=$(date +%s)
if [ -f .deps/jit-cache.tgz ]; then
  mkdir -p .deps/build/jit-cache && tar -xzf .deps/jit-cache.tgz -C .deps/build/jit-cache
fi
bash scripts/build_deps.sh --prefix .deps/build --deep-gemm-src .deps/src/DeepGEMM --jobs 8 \
  deep_gemm > "$OUT/deps.log" 2>&1 &
deps=$!
if [ -n "${SGL_PROBE:-}" ]; then  # the SGLang fork of DeepGEMM, built beside it (stage_sgl_deep_gemm.sh)
  [ -d .deps/src/sgl-DeepGEMM/third-party ] || cp -a .deps/src/DeepGEMM/third-party .deps/src/sgl-DeepGEMM/
  bash scripts/build_deps.sh --prefix .deps/build-sgl --deep-gemm-src .deps/src/sgl-DeepGEMM \
    --jobs 8 --no-check deep_gemm > "$OUT/sgl_deps.log" 2>&1 &
  sgl_deps=$!
fi
if [ -n "${KERNEL_TESTS:-}" ]; then
  timeout "${KERNEL_SECONDS:-200}" make gpu-test PY=python3 GPU_DIST="${KERNEL_DIST:-load}" \
    GPU_TESTS="$KERNEL_TESTS" > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests: exit $? ($(( $(date +%s) - start )) s)"; tail -n 3 "$OUT/kernel_tests.log"
fi
wait $deps
echo "deps: exit $? ($(( $(date +%s) - start )) s)"; tail -n 2 "$OUT/deps.log"
. .deps/build/env.sh
if [ -n "${SGL_PROBE:-}" ]; then  # after both builds: the probe imports the fork as sgl_deep_gemm
  wait $sgl_deps
  echo "sgl deps: exit $? ($(( $(date +%s) - start )) s)"; tail -n 3 "$OUT/sgl_deps.log"
  rm -rf /tmp/sgl && mkdir -p /tmp/sgl && cp -rL .deps/build-sgl/DeepGEMM/deep_gemm /tmp/sgl/sgl_deep_gemm
  (cd benchmarks && eval "PYTHONPATH=/tmp/sgl:$PYTHONPATH timeout ${SGL_SECONDS:-300} python3 $SGL_PROBE") \
    > "$OUT/sgl_probe.log" 2>&1
  echo "== sgl probe: exit $? ($(( $(date +%s) - start )) s)"; tail -n 30 "$OUT/sgl_probe.log"
fi
for run in ${RUNS:-}; do
  IFS=: read -r label names reference tokens <<< "$run"
  (cd benchmarks && timeout "${RUN_SECONDS:-300}" python3 prefill_ab.py --packages "$names" \
    --reference "$reference" --tokens "$tokens" ${PROFILE:+--profile} ${ROUNDS:+--rounds $ROUNDS} --out "$OUT/prefill_$label.json") \
    > "$OUT/prefill_$label.log" 2>&1
  echo "== $label: exit $? ($(( $(date +%s) - start )) s)"; grep -v "^      " "$OUT/prefill_$label.log" | tail -n 24
done
IFS=';' read -ra probes <<< "${PROBES:-}"
for i in "${!probes[@]}"; do
  (cd benchmarks && eval "timeout ${PROBE_SECONDS:-300} python3 ${probes[$i]}") > "$OUT/probe_$i.log" 2>&1
  echo "== probe $i: exit $? ($(( $(date +%s) - start )) s)"; tail -n 12 "$OUT/probe_$i.log"
done
if [ -n "${LAYER_TESTS:-}" ]; then
  timeout "${LAYER_SECONDS:-240}" make gpu-test PY=python3 GPU_TESTS="$LAYER_TESTS" > "$OUT/layer_tests.log" 2>&1
  echo "layer tests: exit $? ($(( $(date +%s) - start )) s)"; tail -n 4 "$OUT/layer_tests.log"
fi
tar -czf "$OUT/jit-cache.tgz" -C .deps/build/jit-cache . 2>/dev/null
ls -la "$OUT"
