"""Locating build outputs from a test: Bazel runfiles (cwd) first, then bazel-bin of the checkout."""

from __future__ import annotations

import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def find(relative: str) -> str:
    for root in (os.getcwd(), os.path.join(REPO, "bazel-bin")):
        path = os.path.join(root, relative)
        if os.path.exists(path):
            return path
    pytest.skip(f"{relative} is not built (bazel build //rl/kernels/...)")


def cuobjdump(*args: str) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return subprocess.run([tool, *args], capture_output=True, text=True, check=True).stdout
