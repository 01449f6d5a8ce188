#!/usr/bin/env bash
# Build DeepGEMM and DeepEP (V1) from source on a CUDA host, at the commits moec is written
# against (docs/backends.md), into a folder you choose, then check each one on the GPU.
#
#   scripts/build_deps.sh [--prefix DIR] [--deep-gemm-src DIR] [--deep-ep-src DIR]
#                         [--jobs N] [--no-check] [deep_gemm] [deep_ep]
#
# Without a --*-src folder the sources are cloned from GitHub (network needed); a given folder
# must hold the sources at those commits (DeepGEMM with its third-party/cutlass/include and
# third-party/fmt/include). The sources are copied to PREFIX and built there in place, so the
# given folders are never written to. PREFIX/env.sh then sets PYTHONPATH (and DeepGEMM's JIT
# cache) for a shell: `. PREFIX/env.sh`. Exit 2: a usage or set-up problem, said in one line;
# exit 1: a build or check failed (its log is named).
set -uo pipefail

DEEP_GEMM_URL=https://github.com/deepseek-ai/DeepGEMM
DEEP_GEMM_COMMIT=54e22612409371d6364144b69086735beb54e98b
CUTLASS_COMMIT=f3fde58372d33e9a5650ba7b80fc48b3b49d40c8
FMT_COMMIT=553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28
DEEP_EP_URL=https://github.com/deepseek-ai/DeepEP
DEEP_EP_COMMIT=29d31c095796f3c8ece47ee9cdcc167051bbeed9
MARKER=.built-by-moec-build-deps  # in each copy this script made (and may replace)

PYTHON=${PYTHON:-python3}
prefix=.deps/build
deep_gemm_src=""
deep_ep_src=""
jobs=$(nproc 2>/dev/null || echo 4)
check=1
wanted=()

fail() {  # usage or set-up problem: one line, exit 2
  echo "build_deps: $*" >&2
  exit 2
}

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
  case $1 in
    --prefix) [ $# -ge 2 ] || fail "--prefix needs a folder"; prefix=$2; shift 2 ;;
    --deep-gemm-src) [ $# -ge 2 ] || fail "--deep-gemm-src needs a folder"; deep_gemm_src=$2; shift 2 ;;
    --deep-ep-src) [ $# -ge 2 ] || fail "--deep-ep-src needs a folder"; deep_ep_src=$2; shift 2 ;;
    --jobs) [ $# -ge 2 ] || fail "--jobs needs a number"; jobs=$2; shift 2 ;;
    --no-check) check=0; shift ;;
    -h | --help) usage; exit 0 ;;
    deep_gemm | deep_ep) wanted+=("$1"); shift ;;
    *) fail "unknown argument '$1' (expected --prefix, --deep-gemm-src, --deep-ep-src, --jobs, --no-check, deep_gemm, deep_ep; see --help)" ;;
  esac
done
[ ${#wanted[@]} -gt 0 ] || wanted=(deep_gemm deep_ep)
[ -n "$prefix" ] || fail "--prefix is empty"
case $jobs in '' | *[!0-9]* | 0) fail "--jobs must be a positive integer, not '$jobs'" ;; esac
wants() { [[ " ${wanted[*]} " == *" $1 "* ]]; }

# The sources first (a wrong folder is a mistake to report before looking for CUDA).
need_files() {  # need_files NAME DIR FILE...: every FILE exists under DIR
  local name=$1 dir=$2
  shift 2
  [ -d "$dir" ] || fail "$name source folder '$dir' does not exist"
  for file in "$@"; do
    [ -e "$dir/$file" ] || fail "'$dir' is not a $name source tree at the commit docs/backends.md names: it has no $file"
  done
}
if wants deep_gemm && [ -n "$deep_gemm_src" ]; then
  need_files DeepGEMM "$deep_gemm_src" setup.py deep_gemm/__init__.py csrc/python_api.cpp \
    third-party/cutlass/include/cute third-party/cutlass/include/cutlass third-party/fmt/include/fmt
fi
if wants deep_ep && [ -n "$deep_ep_src" ]; then
  need_files DeepEP "$deep_ep_src" setup.py deep_ep/__init__.py deep_ep/buffer.py csrc/deep_ep.cpp
fi

# A CUDA toolkit, and a torch built for CUDA.
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")}
[ -x "$cuda_home/bin/nvcc" ] || fail "no CUDA toolkit here (no nvcc under CUDA_HOME or on PATH): DeepGEMM and DeepEP build on a CUDA host only"
torch_cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null) \
  || fail "$PYTHON cannot import torch (set PYTHON to the interpreter that has it)"
[ -n "$torch_cuda" ] || fail "$PYTHON's torch is a CPU build: install a CUDA build of torch first"
# The distribution's compilers: a compiler wrapper that links its own libstdc++ builds a
# DeepGEMM whose JIT crashes at its first kernel (docs/backends.md).
cc=/usr/bin/gcc cxx=/usr/bin/g++
[ -x "$cxx" ] || { cc=gcc cxx=g++; }
command -v "$cxx" >/dev/null || fail "no C++ compiler ($cxx)"

mkdir -p "$prefix" || fail "cannot create '$prefix'"
prefix=$(cd "$prefix" && pwd)
logs=$prefix/logs
mkdir -p "$logs" || fail "cannot write into '$prefix'"

clone() {  # clone URL COMMIT DIR: a checkout of COMMIT (network needed)
  git clone --quiet "$1" "$3" && git -C "$3" checkout --quiet "$2"
}

place() {  # place NAME SRC: a fresh copy of SRC at $prefix/NAME, replacing only our own copies
  local target=$prefix/$1
  if [ -e "$target" ]; then
    [ -f "$target/$MARKER" ] || fail "'$target' exists and this script did not make it: choose another --prefix or move it"
    rm -rf "$target"
  fi
  cp -a "$2" "$target" || fail "cannot copy '$2' to '$target'"
  touch "$target/$MARKER"
}

build_deep_gemm() {
  local src=$deep_gemm_src
  if [ -z "$src" ]; then
    src=$prefix/src/DeepGEMM
    if [ ! -d "$src" ]; then
      clone "$DEEP_GEMM_URL" "$DEEP_GEMM_COMMIT" "$src" \
        && clone https://github.com/NVIDIA/cutlass "$CUTLASS_COMMIT" "$src/third-party/cutlass" \
        && clone https://github.com/fmtlib/fmt "$FMT_COMMIT" "$src/third-party/fmt" \
        || { rm -rf "$src"; echo "build_deps: cannot clone DeepGEMM (no network?): pass --deep-gemm-src" >&2; return 2; }
    fi
  fi
  place DeepGEMM "$src"
  # As its develop.sh does: CUTLASS's include folders linked into deep_gemm/include, the host
  # extension built in place and linked beside deep_gemm/__init__.py. Every GPU kernel is
  # compiled later, just in time, by this CUDA toolkit's nvcc, reading those include folders.
  (
    cd "$prefix/DeepGEMM" || exit 1
    ln -sfn "$PWD/third-party/cutlass/include/cutlass" deep_gemm/include/cutlass
    ln -sfn "$PWD/third-party/cutlass/include/cute" deep_gemm/include/cute
    CC=$cc CXX=$cxx DG_USE_LOCAL_VERSION=0 MAX_JOBS=$jobs "$PYTHON" setup.py build || exit 1
    so=$(find build -name '_C*.so' -type f | head -n 1)
    [ -n "$so" ] || { echo "no _C*.so under build/"; exit 1; }
    ln -sfn "../$so" deep_gemm/
  ) > "$logs/deep_gemm.log" 2>&1
}

build_deep_ep() {
  local src=$deep_ep_src
  if [ -z "$src" ]; then
    src=$prefix/src/DeepEP
    [ -d "$src" ] || clone "$DEEP_EP_URL" "$DEEP_EP_COMMIT" "$src" \
      || { rm -rf "$src"; echo "build_deps: cannot clone DeepEP (no network?): pass --deep-ep-src" >&2; return 2; }
  fi
  place DeepEP "$src"
  # NVSHMEM_DIR unset: setup.py finds pip's nvidia-nvshmem-cu1x package by itself (without
  # it the low-latency kernels are left out). CUDA 13 keeps cuda/std/* under include/cccl.
  (cd "$prefix/DeepEP" && env -u NVSHMEM_DIR CC=$cc CXX=$cxx MAX_JOBS=$jobs \
    CPATH="$cuda_home/include/cccl${CPATH:+:$CPATH}" "$PYTHON" setup.py build_ext --inplace) \
    > "$logs/deep_ep.log" 2>&1
}

status=0
pids=()
for name in "${wanted[@]}"; do
  echo "building $name (log: $logs/$name.log)"
  "build_$name" &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  code=$?
  name=${wanted[$i]}
  if [ $code -eq 2 ]; then
    status=2
  elif [ $code -ne 0 ]; then
    echo "build_deps: $name failed to build; the end of $logs/$name.log:" >&2
    tail -n 15 "$logs/$name.log" >&2
    status=1
  fi
done
[ $status -eq 0 ] || exit $status

paths=()
wants deep_gemm && paths+=("$prefix/DeepGEMM")
wants deep_ep && paths+=("$prefix/DeepEP")
joined=$(IFS=:; echo "${paths[*]}")
{
  echo "# written by moec's scripts/build_deps.sh: . this file to import what it built"
  echo "export PYTHONPATH=\"$joined\${PYTHONPATH:+:\$PYTHONPATH}\""
  wants deep_gemm && echo "export DG_JIT_CACHE_DIR=\"\${DG_JIT_CACHE_DIR:-$prefix/jit-cache}\""
} > "$prefix/env.sh"

if [ $check -eq 1 ]; then
  # shellcheck disable=SC1091
  . "$prefix/env.sh"
  if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "built; not checked: no GPU visible here (run again with a GPU, or pass --no-check)"
  else
    if wants deep_gemm; then
      "$PYTHON" - <<'EOF' || { echo "build_deps: DeepGEMM is built but its check failed" >&2; exit 1; }
import deep_gemm, torch
a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
b = torch.randn(2, 256, 512, device="cuda", dtype=torch.bfloat16)
d = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
m = torch.tensor([0] * 128 + [1] * 128, device="cuda", dtype=torch.int32)
deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m)
ref = torch.cat([a[:128] @ b[0].T, a[128:] @ b[1].T])
err = ((d.float() - ref.float()).norm() / ref.float().norm()).item()
assert err < 1e-2, f"grouped GEMM error {err}"
print(f"deep_gemm {deep_gemm.__version__}: a grouped bf16 GEMM ran (error {err:.1e})")
EOF
    fi
    if wants deep_ep; then
      "$PYTHON" -c 'import deep_ep; print("deep_ep: sm90 features compiled:", deep_ep.Buffer.is_sm90_compiled())' \
        || { echo "build_deps: DeepEP is built but does not import" >&2; exit 1; }
    fi
  fi
fi
echo "done: . $prefix/env.sh   (PYTHONPATH=$joined)"
