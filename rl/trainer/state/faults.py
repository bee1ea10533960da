"""Fault and timing points for tests: `RL_KILL_AT=<point>:<step>[:<n>]` SIGKILLs the process that reaches that point
(the n-th time it does, the first by default) (the driver at `checkpoint_written`, an engine actor at
`engine_generate` with the policy version it holds); with `RL_KILL_ONCE=<path>` only the first process to get there,
which creates the file (a replacement goes on past it);
`RL_SEGMENT_DELAY_S=<seconds>` holds each partial-rollout segment's result that long before the next segment, so a
step's generation outlasts the training step beside it and the weight push lands in the middle of its responses."""

from __future__ import annotations

import os
import signal
import time

KILL_AT = "RL_KILL_AT"
KILL_ONCE = "RL_KILL_ONCE"
SEGMENT_DELAY = "RL_SEGMENT_DELAY_S"


_reached: dict[str, int] = {}  # times this process reached each point


def crash_point(point: str, step: int) -> None:
    where = f"{point}:{step}"
    wanted = os.environ.get(KILL_AT) or ""
    if wanted != where and not wanted.startswith(where + ":"):
        return
    _reached[where] = _reached.get(where, 0) + 1
    if _reached[where] != int(wanted[len(where) + 1:] or 1):
        return
    if os.environ.get(KILL_ONCE):
        try:
            os.close(os.open(os.environ[KILL_ONCE], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)


def segment_delay() -> None:
    delay = float(os.environ.get(SEGMENT_DELAY) or 0)
    if delay > 0:
        time.sleep(delay)
