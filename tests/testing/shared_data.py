"""The read-only data in shared/ beside the checkout (../shared), for the tests that read it.

Where it is absent such a test is skipped, which passes with nothing run; under CI (the environment variable CI is
`true`, passed into Bazel's tests by `.bazelrc`) it fails instead, so a CI run cannot go green without the data.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

from rl.tasks.gsm8k.shared_data import SHARED_DIR_ENV, find_shared_gsm8k


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def missing(what: str) -> NoReturn:
    """Skips the test for want of `what`, or fails it under CI."""
    if under_ci():
        pytest.fail(f"{what}; CI=true: ../shared must sit beside the checkout (or ${SHARED_DIR_ENV} name it)",
                    pytrace=False)
    pytest.skip(what)


def shared_gsm8k() -> Path:
    """shared/data/gsm8k (train.jsonl and test.jsonl), or the test is skipped (failed under CI)."""
    found = find_shared_gsm8k()
    if found is None:
        missing(f"GSM8K data not found: expected shared/data/gsm8k beside the repository root or ${SHARED_DIR_ENV}")
    return found


def shared_file(folder: Path, name: str) -> Path:
    """`folder / name`, or the test is skipped (failed under CI)."""
    path = folder / name
    if not path.is_file():
        missing(f"{path} is absent")
    return path
