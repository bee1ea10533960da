"""The agent endpoint's batching: the requests of every open episode gathered into one engine call per `generate`
and sampling setting, flushed once every open episode has a request waiting or after a short linger."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future
from typing import Any

from rl.core.generation.engine import SamplingParams

LINGER_S = 0.05


Waiting = tuple[list[int], SamplingParams, Any, Future]
"""A request: its prompt ids, sampling settings, the `generate` of its episode, and its reply."""


class CallBatcher:
    """Gathers the requests of all open episodes into batches, one engine call per episode's `generate` and
    sampling setting. Whoever plays episodes runs them (`take`, then `run`) on its own thread: the driver's main
    one, or the rollout queue's thread that plays a batch ahead (`trainer.fully_async`)."""

    def __init__(self, open_count, linger_s: float = LINGER_S):
        self.open_count, self.linger_s = open_count, linger_s
        self.cond = threading.Condition()
        self.waiting: list[Waiting] = []
        self.batches = 0
        self.error: BaseException | None = None  # the engine's failure, for the trainer to raise as it is

    def submit(self, prompt_ids: list[int], params: SamplingParams, generate) -> Future:
        future: Future = Future()
        with self.cond:
            self.waiting.append((prompt_ids, params, generate, future))
            self.cond.notify_all()
        return future

    def take(self, timeout_s: float) -> list[Waiting]:
        """The requests waiting once every open episode has one waiting, or `linger_s` after the first arrived (an
        episode may be busy elsewhere, in a tool or a sandbox); nothing when none arrives within `timeout_s`."""
        with self.cond:
            if not self.waiting:
                self.cond.wait(timeout_s)
            if not self.waiting:
                return []
            deadline = time.monotonic() + self.linger_s
            while len(self.waiting) < self.open_count() and time.monotonic() < deadline:
                self.cond.wait(max(deadline - time.monotonic(), 0.001))
            taken, self.waiting = self.waiting, []
            return taken

    def run(self, taken: list[Waiting]) -> None:
        """One engine call per distinct `generate` and sampling setting; each request's future gets its rollout (or
        the error)."""
        groups: dict[tuple[Any, SamplingParams], list[int]] = {}
        for position, (_, params, generate, _) in enumerate(taken):
            groups.setdefault((generate, params), []).append(position)
        for (generate, params), positions in groups.items():
            with self.cond:
                self.batches += 1
                batch = self.batches
            seeded = params if params.seed is None else dataclasses.replace(params, seed=params.seed + batch)
            try:
                rollouts = generate([taken[p][0] for p in positions], seeded)
                for position, rollout in zip(positions, rollouts, strict=True):
                    taken[position][3].set_result(rollout)
            except Exception as error:
                self.error = self.error or error
                for position in positions:
                    if not taken[position][3].done():
                        taken[position][3].set_exception(error)

    def serve_forever(self) -> None:
        """Runs batches as they come, for a caller without a loop of its own (a test's thread)."""
        while True:
            taken = self.take(1.0)
            if taken:
                self.run(taken)
