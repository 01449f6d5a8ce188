#!/usr/bin/env bash
# Stage the SGLang fork of DeepGEMM with the SM90 fused MoE kernel (sgl-project/DeepGEMM pull
# request 24, 805f7e8: a DeepGEMM 2.5.0 tree) at .deps/src/sgl-DeepGEMM, for benchmarks/mega_moe.py.
# Needs a snapshot of the fork (the library's `fetch github:sgl-project/DeepGEMM`); the tree's
# third-party folder (cutlass and fmt at the commits DeepGEMM 2.6.1 uses too) is copied from
# .deps/src/DeepGEMM on the GPU machine by prefill_session.sh, so it is not carried twice.
#   bash benchmarks/stage_sgl_deep_gemm.sh [/work/.mirror/sgl-project+DeepGEMM/repo]
set -euo pipefail
mirror=${1:-/work/.mirror/sgl-project+DeepGEMM/repo}
commit=805f7e800cbece9b8d84f35bedfd0b3788c47bb2
target=.deps/src/sgl-DeepGEMM
[ -d "$mirror" ] || { echo "stage_sgl_deep_gemm: no snapshot at $mirror" >&2; exit 2; }
if [ -e "$target" ]; then  # replace only a copy this script made
  [ -f "$target/.staged-by-moec" ] || { echo "stage_sgl_deep_gemm: $target exists and is not ours" >&2; exit 2; }
  rm -rf "$target"
fi
mkdir -p "$target"
touch "$target/.staged-by-moec"
git --git-dir="$mirror" archive "$commit" setup.py csrc deep_gemm scripts LICENSE | tar -x -C "$target"
echo "staged $(git --git-dir="$mirror" rev-parse "$commit") at $target ($(du -sh "$target" | cut -f1))"
