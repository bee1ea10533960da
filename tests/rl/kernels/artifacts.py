"""Locating build outputs from a test: $RL_BAZEL_BIN (a directory laid out like bazel-bin, for builds made without
Bazel, e.g. tools/gpu/acceptance.sh) first, then Bazel runfiles (cwd), then bazel-bin of the checkout."""

from __future__ import annotations

import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def find(relative: str) -> str:
    for root in (os.environ.get("RL_BAZEL_BIN", ""), os.getcwd(), os.path.join(REPO, "bazel-bin")):
        path = os.path.join(root, relative)
        if root and os.path.exists(path):
            return path
    pytest.skip(f"{relative} is not built (bazel build //rl/kernels/...)")


def cuobjdump(*args: str) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return subprocess.run([tool, *args], capture_output=True, text=True, check=True).stdout
