"""Locate the read-only GSM8K copy kept beside the repository (never copied into it) for tests and examples."""

from __future__ import annotations

import os
from pathlib import Path

SHARED_DIR_ENV = "RL_SHARED_DIR"
GSM8K_FILES = ("train.jsonl", "test.jsonl")


def repo_root() -> Path | None:
    """The source tree's root: the nearest ancestor of this file's real path holding `WORKSPACE`.

    The real path matters under Bazel, whose runfiles tree holds symlinks back into the source tree.
    """
    for directory in Path(os.path.realpath(__file__)).parents:
        if (directory / "WORKSPACE").is_file():
            return directory
    return None


def find_shared_gsm8k() -> Path | None:
    """The GSM8K folder holding train.jsonl and test.jsonl, or None when it is absent.

    Looks first in `$RL_SHARED_DIR/data/gsm8k`, then in `shared/data/gsm8k` beside the repository root.
    """
    candidates = []
    if os.environ.get(SHARED_DIR_ENV):
        candidates.append(Path(os.environ[SHARED_DIR_ENV]).expanduser() / "data" / "gsm8k")
    root = repo_root()
    if root is not None:
        candidates.append(root.parent / "shared" / "data" / "gsm8k")
    for candidate in candidates:
        if all((candidate / name).is_file() for name in GSM8K_FILES):
            return candidate
    return None
