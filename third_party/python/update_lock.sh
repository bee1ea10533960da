#!/usr/bin/env bash
# Regenerates a hash-pinned lock from requirements_<flavour>.in, resolving for this machine's Python (3.11, x86_64).
# Usage: bash third_party/python/update_lock.sh [cpu|gpu]
#   cpu (default) -> requirements_lock.txt      (torch 2.13.0+cpu, the local CPU wheel)
#   gpu           -> requirements_lock_gpu.txt  (torch 2.13.0 CUDA build and vllm from PyPI)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
flavour="${1:-cpu}"
case "$flavour" in
  cpu) lock="$here/requirements_lock.txt" ;;
  gpu) lock="$here/requirements_lock_gpu.txt"
       # The CPU wheel in local find-links directories must not satisfy the CUDA torch pin.
       export PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS="" ;;
  *) echo "usage: $0 [cpu|gpu]" >&2; exit 2 ;;
esac
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
python3 -m pip install --dry-run --ignore-installed --quiet --report "$report" -r "$here/requirements_$flavour.in" \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
python3 "$here/lock_from_report.py" "$report" "$lock" "$here/requirements_$flavour.in"
echo "wrote $lock ($(grep -vc '^#' "$lock") packages)"
