#!/usr/bin/env bash
# tools/mutants.sh PACKAGE [FILE...]: mutation testing of one package against the tests that cover it.
#
# Mutates every function of PACKAGE (e.g. rl/core/algorithms; `rl.core.algorithms` and `//rl/core/algorithms` work
# too), or only the FILEs given (paths under PACKAGE or bare file names: `loss.py`), runs the package's tests
# (tools/mutants/packages.txt) against each mutant and prints the kill rate and every mutant that was not killed
# (path:line, function, the mutation), marking those tools/mutants/equivalent.toml lists as equivalent with a reason.
#
# The tool is mutmut (pinned with hashes in tools/mutants/requirements.txt). mutmut 3 imports the code and the tests
# once, records which tests reach which function, then forks per mutant and runs only those tests; the mutant is
# picked at call time by a trampoline in each function. With torch taking seconds to import, that is minutes for a
# package where a runner that starts a process per mutant (cosmic-ray) takes hours. Timeouts and crashes count as
# killed (the report says how many).
#
# Setup is the script's own: the pinned environment Bazel builds (third_party/python/python_env.bzl; built with
# ./bazelw when missing), and mutmut installed beside it into ~/.cache/rlpost/mutants-tool-<digest> (put on
# PYTHONPATH; the environment itself is never modified). The run works on a copy of rl/ and tests/ in
# ~/.cache/rlpost/mutants-work/<package> (RL_MUTANTS_WORK overrides the parent), kept after the run for
# `mutmut show NAME` there (the report prints each name).
#
# Environment: MUTANTS_JOBS (mutants run at once; default 1, leaving the other cores free),
# RL_MUTANTS_PYTHON (an interpreter with the pinned environment, instead of Bazel's).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
HERE=$REPO/tools/mutants

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 && $1 != -h && $1 != --help ]] || usage
PKG=${1#//}
shift
PKG=${PKG//.//}
PKG=${PKG%/}
[[ -d $PKG ]] || { echo "mutants: no package folder '$PKG' in $REPO" >&2; exit 2; }
read -r -a TESTS <<<"$(awk -v p="$PKG" '$1 == p { $1 = ""; print }' "$HERE/packages.txt")"
if ((${#TESTS[@]} == 0)); then
  echo "mutants: tools/mutants/packages.txt lists no tests for $PKG; add a line '$PKG TEST_PATH...'" >&2
  exit 2
fi
ONLY=()
for f in "$@"; do
  f=${f#"$PKG/"}
  [[ -f $PKG/$f ]] || { echo "mutants: no file $PKG/$f" >&2; exit 2; }
  ONLY+=("$PKG/$f")
done

# The pinned environment: Bazel's venv (its path is in the python_env repository's venv_path.txt).
if [[ -n ${RL_MUTANTS_PYTHON:-} ]]; then
  PY=$RL_MUTANTS_PYTHON
else
  bazel="./bazelw"
  venv_file="$("$bazel" info output_base 2>/dev/null)/external/python_env/venv_path.txt"
  if [[ ! -f $venv_file ]] || [[ ! -x $(cat "$venv_file")/bin/python3 ]]; then
    echo "mutants: building the pinned Python environment (./bazelw build @python_env//:py3_runtime)" >&2
    "$bazel" build @python_env//:py3_runtime >&2
  fi
  PY=$(cat "$venv_file")/bin/python3
fi
[[ -x $PY ]] || { echo "mutants: no interpreter at $PY" >&2; exit 1; }

# mutmut, installed once per lock and interpreter beside the environment. The venv has no pip: the interpreter
# it was made from installs (the same version, so the same wheels).
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/rlpost
version=$("$PY" -c 'import sys; print(sys.version)')
digest=$( (cat "$HERE/requirements.txt"; echo "$version") | sha256sum | cut -c1-12)
TOOL=$CACHE/mutants-tool-$digest
if [[ ! -f $TOOL/.installed ]]; then
  base=$(sed -n 's/^home = //p' "$(dirname "$(dirname "$PY")")/pyvenv.cfg" 2>/dev/null || true)
  pip_py=$base/python3
  [[ -x $pip_py ]] && "$pip_py" -m pip --version >/dev/null 2>&1 || pip_py=$PY
  if [[ $("$pip_py" -c 'import sys; print(sys.version)') != "$version" ]] || ! "$pip_py" -m pip --version >/dev/null 2>&1; then
    echo "mutants: no pip for Python $version (the pinned environment's base interpreter, $pip_py)" >&2
    exit 1
  fi
  echo "mutants: installing tools/mutants/requirements.txt into $TOOL" >&2
  rm -rf "$TOOL.partial"
  PIP_ROOT_USER_ACTION=ignore "$pip_py" -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    --only-binary=:all: --target "$TOOL.partial" -r "$HERE/requirements.txt" >&2
  touch "$TOOL.partial/.installed"
  rm -rf "$TOOL"
  mv "$TOOL.partial" "$TOOL"
fi

# The work copy: rl/ and tests/ (mutmut copies them again into mutants/ and mutates there), the registrations
# moved below their functions (undecorate.py), and mutmut's configuration.
WORK=${RL_MUTANTS_WORK:-$CACHE/mutants-work}/${PKG//\//.}
rm -rf "$WORK"
mkdir -p "$WORK"
tar -c --exclude=__pycache__ --exclude=.hypothesis rl tests | tar -x -C "$WORK"
find "$WORK/$PKG" -name '*.py' -exec "$PY" "$HERE/undecorate.py" {} +
toml_list() { local out="" x; for x in "$@"; do out+="${out:+, }\"$x\""; done; echo "[$out]"; }
((${#ONLY[@]})) && only=("${ONLY[@]}") || only=("$PKG/*")
cat >"$WORK/pyproject.toml" <<EOF
[tool.mutmut]
source_paths = ["rl"]
only_mutate = $(toml_list "${only[@]}")
pytest_add_cli_args = ["-p", "hypothesis.extra.pytestplugin", "-p", "no:cacheprovider", "--import-mode=importlib", "--hypothesis-seed=0"]
pytest_add_cli_args_test_selection = $(toml_list "${TESTS[@]}")
use_git_change_detection = false
EOF

echo "mutants: $PKG${ONLY:+ (${ONLY[*]#"$PKG/"})} against ${TESTS[*]}; work folder $WORK"
start=$(date +%s)
cd "$WORK"
export PYTHONPATH=$TOOL OMP_NUM_THREADS=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1
set +e
"$PY" -m mutmut run --max-children "${MUTANTS_JOBS:-1}" >run.log 2>&1 &
run=$!
trap 'kill "$run" 2>/dev/null' EXIT  # an interrupted script takes its mutmut run with it
ticks=0
while kill -0 "$run" 2>/dev/null; do  # mutmut's progress line, every 30 s
  sleep 1
  if ((++ticks % 30 == 0)); then
    progress=$(tail -c 400 run.log | tr '\r' '\n' | grep -a '/' | tail -n 1)
    [[ -n $progress ]] && echo "mutants: $progress"
  fi
done
wait "$run"
rc=$?
set -e
if ((rc != 0)); then
  tr '\r' '\n' <run.log | tail -n 40 >&2
  echo "mutants: mutmut failed (exit $rc); its log: $WORK/run.log" >&2
  exit 1
fi
trap - EXIT
"$PY" "$HERE/report.py" --package "$PKG" --equivalents "$HERE/equivalent.toml" --seconds $(($(date +%s) - start))
