"""Rollouts generated ahead of training (`trainer.fully_async`): the engines work on the next batches while the
workers train on the current one.

Batch j (the j-th batch drawn, the prompts of step j unless dynamic sampling draws more than one batch for a step)
is submitted to the engines once the policy version they hold, v (the number of updates behind their weights),
satisfies (j - 1) - v <= max_staleness_steps: trained at step j or earlier, by a policy that has had at most j - 1
updates, its rollouts then lag by at most the bound. So the queue holds at most max_staleness_steps + 1 batches,
and with a bound of 0 a batch is submitted only after the previous step's weights reached the engines: the
synchronous schedule, step for step. A step that takes more than one batch (dynamic sampling) takes the next ones
from the queue, submitting one at once when it is empty. Every engine call reports the version it generated with; a
batch found older than the bound (which the submission rule prevents) is dropped, counted, and generated again.

Multi-turn episodes (`environment.env_class`) are queued too: a batch's episodes play in a thread of their own
(`EpisodeJobs`), each turn's engine call as a single-turn batch makes it, and the batch's version is the oldest of
its turns' calls, so the bound holds for every turn.

The data position saved in a checkpoint is the one after the last *trained* batch: batches still in the queue are
drawn again after a resume.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from rl.core.data import PromptBatch
from rl.trainer.workers.waiting import in_daemon_thread


@dataclass
class QueuedBatch:
    step: int
    batch: PromptBatch
    prompts: list[list[int]]
    params: Any
    pending: list
    images: list | None = None  # each prompt's, as encoded (kept for a stale batch's second call)


class SingleTurnJobs:
    """A batch's rollouts as one engine call per engine share (with each prompt's images, a vision-language
    model's): submitted, collected later."""

    def __init__(self, engines):
        self.engines = engines

    def submit(self, batch: PromptBatch, prompts: list[list[int]], params, images: list | None = None) -> list:
        return self.engines.submit(prompts, params, images)

    def collect(self, pending: list) -> tuple[list[int], list]:
        return self.engines.collect(pending)

    def close(self) -> None:
        pass


class EpisodeJobs:
    """A batch's multi-turn episodes (`Episodes.run`), played in a thread of their own while the driver trains;
    every turn's engine call reports its version, and the batch's versions are those of all its turns.

    The threads are daemons, not an executor's: the interpreter joins an executor's threads on its way out, and an
    episode blocked in user code (an environment or agent without a deadline) would then hold the process after a
    Ctrl-C. The queue itself keeps at most max_staleness_steps + 1 batches in flight."""

    def __init__(self, engines, episodes):
        self.engines, self.episodes = engines, episodes

    def submit(self, batch: PromptBatch, prompts: list[list[int]], params, images: list | None = None) -> Future:
        if images:
            raise ValueError("multi-turn episodes do not carry images yet")
        versions: list[int] = []

        def generate(turn_prompts: list[list[int]], turn_params) -> list:
            seen, rollouts = self.engines.collect(self.engines.submit(turn_prompts, turn_params))
            versions.extend(seen)
            return rollouts

        return in_daemon_thread(lambda: (versions, self.episodes.run(generate, batch.records, prompts, params)),
                                "episodes")

    def collect(self, pending: Future) -> tuple[list[int], list]:
        return pending.result()

    def close(self) -> None:
        pass  # a batch in flight ends with the run's episodes (`Trainer.close`); its thread does not hold the exit


class RolloutQueue:
    def __init__(self, jobs, draw: Callable[[], PromptBatch],
                 encode: Callable[[PromptBatch], tuple[list[list[int]], list | None]], params: Callable[[int], Any],
                 max_staleness_steps: int):
        """`jobs` generate a batch (`SingleTurnJobs`, `EpisodeJobs`); `draw()` the next prompt batch, `encode(batch)`
        its prompts as token ids and each prompt's images (None without), `params(step)` the sampling parameters of
        a step (its seed)."""
        self.jobs, self.draw, self.encode, self.params = jobs, draw, encode, params
        self.bound = max_staleness_steps
        self.queue: deque[QueuedBatch] = deque()
        self.next_step = None
        self.engine_version = 0

    def start(self, first_step: int, engine_version: int) -> None:
        self.next_step, self.engine_version = first_step, engine_version

    def fill(self, last_step: int) -> None:
        """Submits every batch the staleness bound allows at the engines' current version."""
        while self.next_step <= last_step and (self.next_step - 1) - self.engine_version <= self.bound:
            self._submit()

    def _submit(self) -> None:
        batch = self.draw()
        prompts, images = self.encode(batch)
        params = self.params(self.next_step)
        self.queue.append(QueuedBatch(self.next_step, batch, prompts, params,
                                      self.jobs.submit(batch, prompts, params, images), images))
        self.next_step += 1

    def take(self, step: int) -> tuple[PromptBatch, list, dict[str, float]]:
        """The next batch for `step` with its rollouts, and the queue's metrics for it."""
        if not self.queue:  # a step drawing more batches than were queued ahead (dynamic sampling)
            self._submit()
        queued = self.queue.popleft()
        assert queued.step >= step, (queued.step, step)
        started, dropped = time.perf_counter(), 0
        while True:
            versions, rollouts = self.jobs.collect(queued.pending)
            lag = (step - 1) - min(versions)
            if lag <= self.bound:
                break
            dropped += len(rollouts)  # older than the bound: generate these prompts again with current weights
            queued.pending = self.jobs.submit(queued.batch, queued.prompts, queued.params, queued.images)
        row = {"policy_lag": float(lag), "stale_dropped": float(dropped), "queue_wait_s": time.perf_counter() - started,
               "queued_batches": float(len(self.queue))}
        return queued.batch, rollouts, {**row, **partial_rollout_metrics(rollouts, step)}

    def weights_updated(self, version: int) -> None:
        self.engine_version = version

    def close(self) -> None:
        self.jobs.close()


def partial_rollout_metrics(rollouts: list, step: int) -> dict[str, float]:
    """With partial rollouts: the share of responses whose tokens come from more than one policy version, and the
    mean lag of a token's version behind the policy trained at `step` (which has had step - 1 updates)."""
    versions = [r.token_versions for r in rollouts if getattr(r, "token_versions", None) is not None]
    if not versions:
        return {}
    tokens = [v for per_token in versions for v in per_token]
    return {"partial_responses": sum(len(set(v)) > 1 for v in versions) / len(versions),
            "token_lag_mean": (step - 1) - sum(tokens) / len(tokens) if tokens else 0.0}
