"""Where the time from the command to the first step goes: phases timed back to back, printed once as one line
(`startup: imports 3.1 s, ray 2.0 s, ...`)."""

from __future__ import annotations

import os
import time


def _seconds_since_process_start() -> float:
    """How long this process has run (interpreter start included), from /proc; 0 where that cannot be read."""
    try:
        with open(f"/proc/{os.getpid()}/stat", encoding="ascii") as stat:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime", encoding="ascii") as uptime:
            now = float(uptime.read().split()[0])
        return max(0.0, now - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class StartupClock:
    """Each `mark(name)` charges the time since the previous mark (the first: since the process started) to phase
    `name`; a phase marked twice adds up."""

    def __init__(self, started: float | None = None):
        self._last = time.perf_counter() - _seconds_since_process_start() if started is None else started
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now

    @property
    def total(self) -> float:
        return sum(self.phases.values())

    def line(self) -> str:
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases.items())
        return f"startup: {parts} (total {self.total:.1f} s)"
