#!/usr/bin/env bash
# The packages a bare GPU machine lacks for tools/gpu/acceptance.sh to run everything (the launcher on Ray, the
# deepspeed and megatron strategies), gathered here for that machine's Python, at the versions of our lock:
#
#     bash tools/gpu/wheels.sh [DIR] [--python-version 3.12]      # DIR defaults to .gpu_wheels (git-ignored)
#
# then, on the GPU machine, with DIR copied beside the checkout:
#
#     OUT=/some/dir bash tools/gpu/acceptance.sh --bare --wheels DIR
#
# What the folder holds: wheels of ray's, deepspeed's and megatron-core's missing dependencies; megatron-core's
# wheel; Liger-Kernel's (the peer bench/kernels_gpu.py measures the chunked loss against); deepspeed's and antlr4's source archives (they publish no wheels; pure Python, installed with the
# machine's setuptools); and ray as a tar.xz of its installed tree without what a training run never loads (the
# Java jars, the dashboard's web client, RLlib): 29 MiB instead of a 76 MiB wheel, so the folder fits in one 60 MiB
# transfer (GPU_WHEELS_LIMIT_MIB). Where it does not, its files are split into DIR/part1, DIR/part2, ..., each within
# the limit, to be carried in separate transfers (`--wheels DIR` installs from all of them); the script prints the
# commands. `--split DIR` splits an existing folder. Needs pip (PyPI reachable), unzip and xz.

set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=$REPO/.gpu_wheels
PYVER=3.12
LIMIT_MIB=${GPU_WHEELS_LIMIT_MIB:-60}
SPLIT_ONLY=0
while (($#)); do
  case $1 in
    --python-version) PYVER=$2; shift ;;
    --split) SPLIT_ONLY=1 ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    *) DIR=$(realpath -m "$1") ;;
  esac
  shift
done
split_and_print_commands() {  # into parts of at most LIMIT_MIB (largest files first, each into the first part it fits)
  python3 - "$DIR" "$LIMIT_MIB" <<'PY'
import os, sys
folder, limit = sys.argv[1], int(sys.argv[2]) * 2**20
files = sorted((f for f in os.listdir(folder) if os.path.isfile(os.path.join(folder, f))),
               key=lambda f: -os.path.getsize(os.path.join(folder, f)))
total = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
rel = os.path.relpath(folder)
rel = folder if rel.startswith("..") else rel  # as the user would type it from here
if total <= limit:
    print(f"{rel}: {total / 2**20:.1f} MiB, one transfer; on the GPU machine, with it beside the checkout:")
    print(f"    OUT=/some/dir bash tools/gpu/acceptance.sh --bare --wheels {rel}")
    sys.exit(0)
parts = []
for f in files:
    size = os.path.getsize(os.path.join(folder, f))
    if size > limit:
        sys.exit(f"FAILED: {f} alone ({size / 2**20:.1f} MiB) is over the {limit // 2**20} MiB of one transfer")
    part = next((p for p in parts if p[0] + size <= limit), None)
    if part is None:
        part = [0, []]
        parts.append(part)
    part[0] += size
    part[1].append(f)
for i, (_, names) in enumerate(parts, 1):
    os.makedirs(os.path.join(folder, f"part{i}"))
    for f in names:
        os.rename(os.path.join(folder, f), os.path.join(folder, f"part{i}", f))
print(f"{rel}: {total / 2**20:.1f} MiB in {len(parts)} parts; carry each to the GPU machine in its own transfer:")
for i, (size, names) in enumerate(parts, 1):
    print(f"    {rel}/part{i}  ({size / 2**20:.1f} MiB, {len(names)} files)")
print(f"then, with every part there:\n    OUT=/some/dir bash tools/gpu/acceptance.sh --bare --wheels {rel}")
PY
}
if ((SPLIT_ONLY)); then
  split_and_print_commands
  exit
fi

PIP=(${PIP_PYTHON:-python3} -m pip)
LOCK=$REPO/third_party/python/requirements_lock.txt
TAG=cp${PYVER/./}

# Missing from the lent machine's image (its package list: /work/.library/device/KINDS.md); the rest of these
# packages' requirements are there.
WHEELS=(megatron-core jsonschema jsonschema-specifications referencing rpds-py hjson pydantic pydantic-core
  annotated-types typing-inspection omegaconf)
SDISTS=(deepspeed antlr4-python3-runtime)
# Not ours to depend on: the peer bench/kernels_gpu.py compares the chunked loss with (pure Python and Triton)
PEERS=(liger-kernel==0.8.5)

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
"${PIP[@]}" download -q --no-deps --only-binary=:all: -d "$DIR" "${PEERS[@]}"

ray=$(pinned ray)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PIP[@]}" download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${platforms[@]}" -d "$tmp" "$ray"
(cd "$tmp" && unzip -q ./*.whl -x 'ray/jars/*' 'ray/dashboard/client/build/*' 'ray/rllib/*' &&
  tar -cf - ray ./*.dist-info | xz -T0 -6 >"$DIR/${ray/==/-}-$TAG-slim.tar.xz")

ls -l "$DIR"
split_and_print_commands
