"""Crash points for recovery tests: `RL_KILL_AT=<point>:<step>` SIGKILLs the driver when it reaches that point."""

from __future__ import annotations

import os
import signal

KILL_AT = "RL_KILL_AT"


def crash_point(point: str, step: int) -> None:
    if os.environ.get(KILL_AT) == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
