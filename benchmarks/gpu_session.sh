#!/usr/bin/env bash
# One call on the GPU machine, from the repo root, with .whl (moec's own dependencies as wheels,
# and pytest-xdist with execnet, which make gpu-test runs its files in parallel with)
# and, for the DeepGEMM / DeepEP steps, .deps carried. Logs and JSON go to /tmp/session, packed
# into $RESULTS/session.tgz at the end (the device tool returns at most 8 files). The bench step
# also records each layer's best time per T in $RESULTS/times.json (a tuned table's backends/<key>
# entries, which gemm_backend auto chooses by).
#   STEPS="test bench"  (any of: deps test bench bench-ab prefill decode prefetch micro tune tune-ab tune-keys parallel check)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RESULTS=/tmp/session
mkdir -p "$RESULTS"
trap 'tar -czf "${OUT:-/tmp}/session.tgz" -C /tmp session; save_jit_cache' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export MOEC_GPU_REPORT=$RESULTS
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"

deps() {  # DeepGEMM (and DeepEP where DEPS names it) by scripts/build_deps.sh, from the sources
  # carried in .deps/src (see docs/backends.md), into .deps/build; DeepGEMM's compiled kernels
  # come back in $OUT/jit-cache.tgz, which a later call may carry as .deps/jit-cache.tgz
  [ -d .deps/src ] || { echo "deps: no .deps/src carried"; return 1; }
  [ -f .deps/jit-cache.tgz ] && mkdir -p .deps/build/jit-cache \
    && tar -xzf .deps/jit-cache.tgz -C .deps/build/jit-cache
  bash scripts/build_deps.sh --prefix .deps/build --deep-gemm-src .deps/src/DeepGEMM \
    --deep-ep-src .deps/src/DeepEP --jobs 16 ${DEPS:-deep_gemm} > "$RESULTS/build_deps.log" 2>&1
  tail -n 3 "$RESULTS/build_deps.log"
  . .deps/build/env.sh
}
save_jit_cache() {  # DeepGEMM's JIT cache, for the next call
  [ -d .deps/build/jit-cache ] && tar -czf "${OUT:-/tmp}/jit-cache.tgz" -C .deps/build/jit-cache .
}
# deep_gemm / deep_ep where a previous call (on this warm machine) or the deps step built them
[ -f .deps/build/env.sh ] && . .deps/build/env.sh

packages() {  # the benchmark packages, built here with moec itself (once per call)
  [ -d benchmarks/.packages ] && [ -n "${PACKAGES_BUILT:-}" ] && return
  MOEC="python3 -m moec" ./benchmarks/build_packages.sh > "$RESULTS/packages.log" 2>&1
  PACKAGES_BUILT=1
}

for step in ${STEPS:-test bench}; do
  start=$(date +%s)
  case $step in
    deps) deps ;;
    test) make gpu-test PY=python3 ${GPU_TESTS:+GPU_TESTS="$GPU_TESTS"} 2>&1 | tee "$RESULTS/gpu-test.log" | tail -25 ;;
    bench)
      packages
      for scheme in ${SCHEMES:-fp8_block fp8_block_separate bf16 fp8_block_deep_gemm bf16_deep_gemm}; do
        times=()  # the layers gemm_backend auto chooses between (shared experts fused)
        case " ${TIMES_SCHEMES:-fp8_block fp8_block_deep_gemm bf16 bf16_deep_gemm} " in
          *" $scheme "*) times=(--times-table "$RESULTS/times.json" --times-source "${TIMES_SOURCE:-bench_moe.py}") ;;
        esac
        python3 benchmarks/bench_moe.py --scheme "$scheme" --tokens "${TOKENS:-1,16,64,256,1024,4096,16384}" \
          --out "$RESULTS/bench_$scheme.json" "${times[@]}" > "$RESULTS/bench_$scheme.log" 2>&1
        tail -9 "$RESULTS/bench_$scheme.log"
      done
      ;;
    bench-ab)  # the default Triton layer, then without PDL, then with the dispatch in two launches
      packages
      for variant in default no-pdl split-dispatch; do
        case $variant in
          default) flags="" ;;
          no-pdl) flags="--no-pdl" ;;
          split-dispatch) flags="--split-dispatch" ;;
        esac
        python3 benchmarks/bench_moe.py --scheme "${AB_SCHEME:-fp8_block}" --tokens "${AB_TOKENS:-1,64,4096}" \
          --torch-max-tokens 64 $flags --out "$RESULTS/ab_$variant.json" > "$RESULTS/ab_$variant.log" 2>&1
        echo "== $variant"; tail -4 "$RESULTS/ab_$variant.log"
      done
      ;;
    decode)  # kernel durations of one graph replay at decode, fp8 and bf16, Triton and DeepGEMM
      packages
      python3 benchmarks/profile_decode.py --tokens "${DECODE_TOKENS:-1,16}" \
        --packages "${DECODE_PACKAGES:-$(ls benchmarks/.packages | grep -E 'v3_(fp8|fp8sep|bf16)_(triton|deep_gemm)$' | paste -sd,)}" \
        --out "$RESULTS/decode.json" > "$RESULTS/decode.log" 2>&1
      grep -E "^bench|: graph" "$RESULTS/decode.log"
      ;;
    prefetch)  # decode with the shared expert's weights fetched into L2 before the router
      packages
      python3 benchmarks/prefetch_decode.py --tokens "${PREFETCH_TOKENS:-1,4}" \
        --out "$RESULTS/prefetch.json" > "$RESULTS/prefetch.log" 2>&1
      tail -40 "$RESULTS/prefetch.log"
      ;;
    micro)  # the decode path's router and select kernels alone, grid and warp variants
      packages
      python3 benchmarks/micro_decode.py --out "$RESULTS/micro_decode.json" > "$RESULTS/micro_decode.log" 2>&1
      tail -40 "$RESULTS/micro_decode.log"
      ;;
    tune)  # moec tune of the V3 layer on this GPU: $RESULTS/tuned/<gpu>.json, then the plan's line
      spec=(benchmarks/specs/v3.toml --set quant.scheme="${TUNE_SCHEME:-fp8_block}")
      MOEC_TUNING_DIR=$RESULTS/tuned timeout "${TUNE_SECONDS:-3000}" python3 -m moec tune "${spec[@]}" \
        --tokens "${TUNE_TOKENS:-1,16,64,256,1024,4096,16384}" > "$RESULTS/tune.log" 2>&1
      tail -4 "$RESULTS/tune.log"
      MOEC_TUNING_DIR=$RESULTS/tuned python3 -m moec explain "${spec[@]}" | grep "triton tiles ="
      ;;
    tune-ab)  # tune some buckets afresh, then the layer with the shipped table and with them
      packages
      key=fp8_block/H7168/I2048/E256/K8
      MOEC_TUNING_DIR=$RESULTS/tuned timeout "${TUNE_SECONDS:-300}" python3 -m moec tune \
        benchmarks/specs/v3.toml --set quant.scheme=fp8_block --tokens "$TUNE_TOKENS" \
        > "$RESULTS/tune.log" 2>&1
      tail -3 "$RESULTS/tune.log"
      python3 benchmarks/merge_tuned.py moec/plan/tuned/h200.json "$RESULTS"/tuned/*.json \
        --tokens "$TUNE_TOKENS" --key $key -o "$RESULTS/merged.json" || continue
      for table in shipped merged; do
        file=moec/plan/tuned/h200.json
        [ $table = merged ] && file=$RESULTS/merged.json
        python3 benchmarks/bench_moe.py --scheme fp8_block --tokens "${AB_TOKENS:-$TUNE_TOKENS}" \
          --torch-max-tokens 0 --tuned "$file" --out "$RESULTS/tune_$table.json" > "$RESULTS/tune_$table.log" 2>&1
        echo "== $table"; tail -3 "$RESULTS/tune_$table.log"
      done
      ;;
    tune-keys)  # moec tune of V3 variants (TUNE_SETS: ";"-separated groups of --set values) into one table
      IFS=';' read -ra groups <<< "${TUNE_SETS:-model.n_routed_experts=128;parallel.tp_size=2}"
      for group in "${groups[@]}"; do
        sets=()
        for value in $group; do sets+=(--set "$value"); done
        MOEC_TUNING_DIR=$RESULTS/tuned timeout "${TUNE_SECONDS:-240}" python3 -m moec tune \
          benchmarks/specs/v3.toml --set quant.scheme=fp8_block "${sets[@]}" \
          --tokens "${TUNE_TOKENS:-1,16,64,256,1024,4096,16384}" >> "$RESULTS/tune.log" 2>&1
        tail -2 "$RESULTS/tune.log"
      done
      ;;
    parallel)  # the two-GPU layers (EP over all2all and DeepEP, TP) and their stages, per rank
      packages
      jobs="bench_v3_fp8_ep2_all2all_triton:${PAR_TOKENS:-256,4096}"
      jobs="$jobs bench_v3_fp8ovl_ep2_all2all_triton:${PAR_TOKENS:-256,4096}"
      jobs="$jobs bench_v3_fp8_tp2_triton:${PAR_TOKENS:-256,4096}"
      for name in bench_v3_fp8_ep2_normal_triton bench_v3_fp8_ep2_normal_deep_gemm \
        bench_v3_fp8_ep2_all2all_deep_gemm; do
        [ -d benchmarks/.packages/$name ] && jobs="$jobs $name:${PAR_TOKENS:-256,4096}"
      done
      for name in bench_v3_fp8_ep2_ll_triton bench_v3_fp8_ep2_ll_deep_gemm; do
        [ -d benchmarks/.packages/$name ] && jobs="$jobs $name:${LL_TOKENS:-16,128}"
      done
      timeout "${PAR_SECONDS:-400}" python3 benchmarks/bench_parallel.py --packages "$jobs" \
        --single bench_v3_fp8_triton,bench_v3half_fp8_triton --out "$RESULTS/parallel.json" > "$RESULTS/parallel.log" 2>&1
      grep -v "^ *\(router\|select\|quantize\|activation\|shared_expert\) " "$RESULTS/parallel.log" | tail -60
      ;;
    prefill)  # PREFILL="label:package,package,...:reference ...": prefill_ab.py at PREFILL_TOKENS
      for run in ${PREFILL:-}; do
        IFS=: read -r label names reference <<< "$run"
        (cd benchmarks && timeout "${PREFILL_SECONDS:-400}" python3 prefill_ab.py \
          --packages "$names" --reference "$reference" --tokens "${PREFILL_TOKENS:-2048,4096,8192,16384}" \
          ${PREFILL_PROFILE:+--profile} --out "$RESULTS/prefill_$label.json") > "$RESULTS/prefill_$label.log" 2>&1
        echo "== $label"; grep -v "^      " "$RESULTS/prefill_$label.log" | tail -30
      done
      ;;
    check)  # python -m <package>.check of the V3 layer: Triton fp8_block, torch bf16
      for variant in fp8_block:triton bf16:torch; do
        name=check_${variant/:/_}
        python3 -m moec build benchmarks/specs/v3.toml -o /tmp/check --set name="$name" \
          --set quant.scheme="${variant%:*}" --set experts.gemm_backend="${variant#*:}" > /dev/null
        (cd /tmp/check && python3 -m "$name.check" --tokens "${CHECK_TOKENS:-1,64,4096}") 2>&1 \
          | tee "$RESULTS/$name.log"
      done
      ;;
  esac
  echo "step $step: $(( $(date +%s) - start )) s"
done
