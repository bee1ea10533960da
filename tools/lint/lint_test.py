"""Lint of the whole tree: ruff over the Python sources, buildifier (when installed) over BUILD and .bzl files.

The test resolves the real source tree through the symlink of its pyproject.toml data dependency and is tagged
`external` so it always runs: lint results must never be served stale from Bazel's cache.
"""

import os
import shutil
import subprocess
import sys

import pytest


def _workspace_root() -> str:
    here = os.path.realpath("pyproject.toml")
    return os.path.dirname(here)


def _bazel_files(root: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "bazel-")) and d != "node_modules"]
        found += [os.path.join(dirpath, f) for f in filenames if f in ("BUILD", "BUILD.bazel", "WORKSPACE")
                  or f.endswith((".bzl", ".BUILD.tpl"))]
    return sorted(found)


def test_ruff_is_clean():
    root = _workspace_root()
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    result = subprocess.run([ruff, "check", "--no-cache", "."], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_buildifier_is_clean():
    buildifier = shutil.which("buildifier")
    if not buildifier:
        pytest.skip("buildifier is not installed (./bazelw installs it from npm's @bazel/buildifier)")
    root = _workspace_root()
    files = [f for f in _bazel_files(root) if not f.endswith(".tpl")]
    result = subprocess.run([buildifier, "--mode=check", "--lint=off", *files], cwd=root, capture_output=True,
                            text=True)
    assert result.returncode == 0, "run `buildifier -r .` to fix:\n" + result.stdout + result.stderr
