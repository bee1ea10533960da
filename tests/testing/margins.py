"""How close each float comparison comes to its bound, recorded when RLPOST_BOUND_MARGINS is set.

A derived bound needs no measurement; an empirical one (`tolerances.network_rtol` and what builds on it) is only as
good as its margin under every kernel path. With RLPOST_BOUND_MARGINS=1 (under Bazel: written to the target's
undeclared outputs) or =PATH, every `assert_within` appends one JSON line: the comparing line of the test, the
message, the kernel path, and the largest |gap| / bound over the compared elements (1.0 is the bound reached).
`tools/bound_margins.sh` runs the numeric targets so under each kernel path and prints the table.
"""

from __future__ import annotations

import json
import os
import sys

import torch

FILE_NAME = "bound_margins.jsonl"


def _path() -> str | None:
    setting = os.environ.get("RLPOST_BOUND_MARGINS")
    if not setting:
        return None
    if setting != "1":
        return setting
    folder = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
    if not folder:
        raise RuntimeError("RLPOST_BOUND_MARGINS=1 writes under Bazel's TEST_UNDECLARED_OUTPUTS_DIR, which is not "
                           "set: outside Bazel give a file path instead")
    return os.path.join(folder, FILE_NAME)


def _is_helper(filename: str) -> bool:
    folder, name = os.path.split(filename)
    return os.path.basename(folder) == "testing" and not name.startswith("test_")


def _caller() -> str:
    """The first frame outside the helpers of tests/testing: the test line that made the comparison."""
    frame = sys._getframe(2)
    while frame is not None and _is_helper(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "?"
    name = frame.f_code.co_filename
    start = name.rfind(f"{os.sep}tests{os.sep}")
    return f"{name[start + 1:] if start >= 0 else name}:{frame.f_lineno}"


def record(gap: torch.Tensor, bound: torch.Tensor, msg: str) -> None:
    path = _path()
    if path is None or gap.numel() == 0:
        return
    ratio = torch.where(bound > 0, gap / bound, torch.where(gap > 0, torch.inf, 0.0))
    entry = {
        "site": _caller(),
        "msg": msg[:80],
        "path": os.environ.get("ATEN_CPU_CAPABILITY", "native"),
        "ratio": float(torch.nan_to_num(ratio, nan=torch.inf).max()),
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")
