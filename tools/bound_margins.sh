#!/usr/bin/env bash
# How close each float comparison of the numeric targets comes to its bound, under each CPU kernel path this machine
# has: runs them with RLPOST_BOUND_MARGINS=1 (tests/testing/margins.py) and prints, per comparing line, the largest
# |gap| / bound seen under each path (1.0 = the bound reached). Empirical bounds are shown true by these margins.
# Usage: tools/bound_margins.sh [bazel test args]   (default: every target tagged numeric, GPU ones excluded)
set -euo pipefail
cd "$(dirname "$0")/.."
bazel="${BAZEL:-./bazelw}"
[ -x "$bazel" ] || bazel=bazel
paths=(default avx2)
if grep -qw avx512f /proc/cpuinfo; then paths+=(avx512); fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(//...)
out="$(mktemp -d)"
for path in "${paths[@]}"; do
  echo "bound_margins: ATEN_CPU_CAPABILITY=$path"
  "$bazel" test "--config=kernels_$path" --test_env=RLPOST_BOUND_MARGINS=1 \
    --nocache_test_results -- "${targets[@]}" || echo "bound_margins: some targets failed under $path"
  python3 tools/suite/bound_margins.py --collect bazel-testlogs > "$out/$path.jsonl"
done
python3 tools/suite/bound_margins.py "$out"/*.jsonl
