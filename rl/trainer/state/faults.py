"""Fault and timing points for tests: `RL_KILL_AT=<point>:<step>` SIGKILLs the driver when it reaches that point;
`RL_SEGMENT_DELAY_S=<seconds>` holds each partial-rollout segment's result that long before the next segment, so a
step's generation outlasts the training step beside it and the weight push lands in the middle of its responses."""

from __future__ import annotations

import os
import signal
import time

KILL_AT = "RL_KILL_AT"
SEGMENT_DELAY = "RL_SEGMENT_DELAY_S"


def crash_point(point: str, step: int) -> None:
    if os.environ.get(KILL_AT) == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def segment_delay() -> None:
    delay = float(os.environ.get(SEGMENT_DELAY) or 0)
    if delay > 0:
        time.sleep(delay)
