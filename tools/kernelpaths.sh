#!/usr/bin/env bash
# The numeric test targets under each CPU kernel path this machine has (ATEN_CPU_CAPABILITY default, avx2 and,
# where the CPU has avx512f, avx512): float results differ by path, and every bound must hold on each.
# Usage: tools/kernelpaths.sh [bazel test args, e.g. //tests/rl/core/...]   (default: //...)
set -euo pipefail
cd "$(dirname "$0")/.."
bazel="${BAZEL:-./bazelw}"
[ -x "$bazel" ] || bazel=bazel
paths=(default avx2)
if grep -qw avx512f /proc/cpuinfo; then paths+=(avx512); else echo "kernelpaths: no avx512f in /proc/cpuinfo, skipping avx512"; fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(//...)
failed=()
for path in "${paths[@]}"; do
  echo "kernelpaths: ATEN_CPU_CAPABILITY=$path"
  "$bazel" test "--config=kernels_$path" -- "${targets[@]}" || failed+=("$path")
done
if [ ${#failed[@]} -gt 0 ]; then echo "kernelpaths: failed under ${failed[*]}"; exit 1; fi
echo "kernelpaths: passed under ${paths[*]}"
