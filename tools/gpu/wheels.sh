#!/usr/bin/env bash
# The packages a bare GPU machine lacks for tools/gpu/acceptance.sh to run everything (the launcher on Ray, the
# deepspeed and megatron strategies), gathered here for that machine's Python, at the versions of our lock:
#
#     bash tools/gpu/wheels.sh [DIR] [--python-version 3.12]      # DIR defaults to .gpu_wheels (git-ignored)
#
# then, on the GPU machine, with DIR copied beside the checkout:
#
#     OUT=/some/dir bash tools/gpu/acceptance.sh --wheels DIR
#
# What the folder holds: wheels of ray's, deepspeed's and megatron-core's missing dependencies; megatron-core's
# wheel; deepspeed's and antlr4's source archives (they publish no wheels; pure Python, installed with the
# machine's setuptools); and ray as a tar.xz of its installed tree without what a training run never loads (the
# Java jars, the dashboard's web client, RLlib): 29 MiB instead of a 76 MiB wheel, so the folder fits in one 60 MiB
# transfer. The script fails if it does not. Needs pip (PyPI reachable), unzip and xz.

set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=$REPO/.gpu_wheels
PYVER=3.12
LIMIT_MIB=60
while (($#)); do
  case $1 in
    --python-version) PYVER=$2; shift ;;
    -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    *) DIR=$(realpath -m "$1") ;;
  esac
  shift
done
PIP=(${PIP_PYTHON:-python3} -m pip)
LOCK=$REPO/third_party/python/requirements_lock.txt
TAG=cp${PYVER/./}

# Missing from the lent machine's image (its package list: /work/.library/device/KINDS.md); the rest of these
# packages' requirements are there.
WHEELS=(megatron-core jsonschema jsonschema-specifications referencing rpds-py hjson pydantic pydantic-core
  annotated-types typing-inspection omegaconf)
SDISTS=(deepspeed antlr4-python3-runtime)

pinned() {  # name -> name==version from the lock
  local line
  line=$(grep -m1 -i "^$1==" "$LOCK") || { echo "$1 is not in $LOCK" >&2; exit 1; }
  echo "${line%% *}"
}

rm -rf "$DIR"
mkdir -p "$DIR"
specs=()
for name in "${WHEELS[@]}"; do specs+=("$(pinned "$name")"); done
platforms=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 \
  manylinux2014 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
"${PIP[@]}" download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" -d "$DIR" "${specs[@]}"
specs=()
for name in "${SDISTS[@]}"; do specs+=("$(pinned "$name")"); done
"${PIP[@]}" download -q --no-deps --no-binary=:all: -d "$DIR" "${specs[@]}"

ray=$(pinned ray)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PIP[@]}" download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" -d "$tmp" "$ray"
(cd "$tmp" && unzip -q ./*.whl -x 'ray/jars/*' 'ray/dashboard/client/build/*' 'ray/rllib/*' &&
  tar -cf - ray ./*.dist-info | xz -T0 -6 >"$DIR/${ray/==/-}-$TAG-slim.tar.xz")

ls -l "$DIR"
size=$(du -sm "$DIR" | cut -f1)
echo "$DIR: $size MiB"
if ((size > LIMIT_MIB)); then
  echo "FAILED: over the $LIMIT_MIB MiB that one transfer to the GPU machine carries" >&2
  exit 1
fi
