#!/usr/bin/env bash
# What `bazel build --config=gpu` builds for the GPU tests, without Bazel: //rl/kernels/cuda:rl_kernels_cuda.so and
# //tests/third_party/cuda:axpy_ext.so with nvcc (sm_80, sm_90 + compute_90 PTX, as third_party/cuda/cuda.bzl, plus
# the local GPU's arch if it is neither) + pybind11 + static cudart, and //rl/kernels/aot:triton (every Triton kernel
# AOT for sm_80 and sm_90), in parallel, into BIN laid out like bazel-bin (the tests read it through $RL_BAZEL_BIN).
# Run from anywhere; PYTHON (python3) must have torch, triton and pybind11 and its headers.
#
#     bash tools/gpu/build.sh BIN [LIMIT_S]      # each compiler call stopped after LIMIT_S (300)
#     bash tools/gpu/build.sh --versions         # the compilers it would use
#
# Exits non-zero if any output failed to build (each one's log is printed).

set -u
set -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
PYTHON=${PYTHON:-python3}

find_cuda_home() {  # third_party/cuda/local_cuda.bzl's order: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, nvcc on PATH
  local root
  for root in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    if [[ -n $root && -x $root/bin/nvcc ]]; then echo "$root"; return; fi
  done
  root=$(command -v nvcc) && dirname "$(dirname "$root")"
}
CUDA_ROOT=$(find_cuda_home)
NVCC=${CUDA_ROOT:-/usr/local/cuda}/bin/nvcc
CXX=${CXX:-$(command -v g++ || command -v c++ || echo g++)}
if [[ ${1:-} == --versions ]]; then
  "$NVCC" --version | tail -n 2
  "$CXX" --version | head -n 1
  exit
fi
if [[ -z ${1:-} || $1 == -* ]]; then
  sed -n '2,11p' "$0"
  exit 2
fi
BIN=$(realpath -m "$1")
BUILD_LIMIT=${2:-300}
WORK=$(mktemp -d -t gpu_build.XXXXXX)  # objects and logs
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$BIN/rl/kernels/cuda" "$BIN/tests/third_party/cuda" "$BIN/rl/kernels/aot" "$WORK/logs"

GENCODES=(-gencode "arch=compute_80,code=sm_80" -gencode "arch=compute_90,code=sm_90"
  -gencode "arch=compute_90,code=compute_90")  # third_party/cuda/cuda.bzl: DEFAULT_GENCODES

cuda_extension() {  # name out.so bindings.cc cu... : what third_party/cuda/cuda.bzl's py_cuda_extension builds
  local name=$1 out=$2 bindings=$3 objs=() pids=() src obj pid status=0
  shift 3
  local cuda_home=$CUDA_ROOT py_inc pybind_inc cudart
  cudart=$cuda_home/lib64/libcudart_static.a
  [[ -f $cudart ]] || cudart=$cuda_home/lib/libcudart_static.a
  py_inc=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  pybind_inc=$("$PYTHON" -c 'import pybind11; print(pybind11.get_include())')
  if [[ ! -f $py_inc/Python.h ]]; then
    echo "$name: no Python.h under $py_inc (the Python headers are not installed)"
    return 1
  fi
  mkdir -p "$WORK/objs/$name"
  for src in "$@"; do
    obj=$WORK/objs/$name/$(basename "$src").o
    objs+=("$obj")
    (set -x; timeout -k 5 "$BUILD_LIMIT" "$NVCC" -c -Xcompiler -fPIC -std=c++17 -O3 --expt-relaxed-constexpr \
      --threads 0 "${GENCODES[@]}" -I"$cuda_home/include" -I. -o "$obj" "$src") &
    pids+=($!)
  done
  (set -x; timeout -k 5 "$BUILD_LIMIT" "$CXX" -c -fPIC -fvisibility=hidden -std=c++17 -O2 -I"$py_inc" \
    -I"$pybind_inc" -I"$cuda_home/include" -I. -o "$WORK/objs/$name/bindings.o" "$bindings") || status=1
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  ((status == 0)) || return 1
  (set -x; "$CXX" -shared -o "$out" "$WORK/objs/$name/bindings.o" "${objs[@]}" "$cudart" -ldl -lpthread -lrt)
}

build() {
  local arch
  arch=$("$PYTHON" -c 'import torch
m, n = torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)
print(f"{m}{n}")')
  if [[ $arch != 80 && $arch != 90 ]]; then
    GENCODES+=(-gencode "arch=compute_$arch,code=sm_$arch")
    echo "the local GPU is sm_$arch: its cubin is added to Bazel's sm_80, sm_90 and compute_90"
  fi
  local t0 pids=() names=() i status=0
  t0=$(date +%s)
  cuda_extension rl_kernels_cuda "$BIN/rl/kernels/cuda/rl_kernels_cuda.so" rl/kernels/cuda/bindings.cc \
    rl/kernels/cuda/fused_loss.cu rl/kernels/cuda/logprobs.cu rl/kernels/cuda/packing.cu \
    >"$WORK/logs/build_ext.log" 2>&1 &
  pids+=($!) names+=("//rl/kernels/cuda:rl_kernels_cuda.so")
  cuda_extension axpy_ext "$BIN/tests/third_party/cuda/axpy_ext.so" tests/third_party/cuda/axpy_bindings.cc \
    tests/third_party/cuda/axpy.cu >"$WORK/logs/build_axpy.log" 2>&1 &
  pids+=($!) names+=("//tests/third_party/cuda:axpy_ext.so")
  for arch in 80 90; do
    timeout -k 10 "$BUILD_LIMIT" "$PYTHON" rl/kernels/aot/triton_aot_compile.py --arch "$arch" \
      --out_dir "$BIN/rl/kernels/aot/triton_sm$arch" >"$WORK/logs/build_triton_sm$arch.log" 2>&1 &
    pids+=($!) names+=("//rl/kernels/aot:triton_sm$arch")
  done
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then
      echo "built ${names[$i]}"
    else
      echo "FAILED ${names[$i]}"
      status=1
    fi
  done
  cat "$WORK"/logs/build_*.log
  echo "build: $(($(date +%s) - t0)) s"
  ls -l "$BIN/rl/kernels/cuda" "$BIN/tests/third_party/cuda"
  echo "triton AOT outputs: $(find "$BIN/rl/kernels/aot" -type f | wc -l) files"
  return $status
}

build
