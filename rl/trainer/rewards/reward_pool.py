"""Reward functions run in a pool of processes with a deadline per call (`data.reward_num_workers`,
`data.reward_timeout_s`), so a slow or hung verifier (code execution, a sandbox) cannot stall the training loop.

Each worker is `python -m rl.trainer.rewards.reward_worker`, started with the driver's Python path; a call that passes
its deadline has its worker killed and replaced and comes back as an error naming what happened. A worker killed
mid-call (a signal: out of memory, a node's trouble) is replaced and the call made again on the fresh one; a row
that kills its worker twice comes back as an error naming it, for data.reward_on_error to handle. A worker whose
code ends its process itself (an exit code) ends the run. With 0 workers the functions run in the driver, one after
another (no deadline: the configuration refuses a timeout there).
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rl.trainer.rewards.reward_worker import receive, send

START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RewardJob:
    function: int  # index into the pool's references
    response: str
    answer: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class RewardOutcome:
    """A finished call: `value` = (score, extras) when `error` is None."""

    value: tuple[float, dict[str, float]] | None
    error: str | None
    fatal: bool = False  # the function raised SystemExit or KeyboardInterrupt: the run ends


class RewardStartError(RuntimeError):
    pass


class _Worker:
    def __init__(self, references: Sequence[str]):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.process = subprocess.Popen([sys.executable, "-m", "rl.trainer.rewards.reward_worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        send(self.process.stdin, list(references))
        self.job: tuple[int, float] | None = None  # (job id, deadline)

    def wait_ready(self, deadline: float) -> None:
        ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        answer = receive(self.process.stdout) if ready else None
        if answer != "ready":
            self.stop()
            why = answer[1] if isinstance(answer, tuple) else "it did not start in time or exited"
            raise RewardStartError(f"data.reward_fn: a reward process could not load the reward functions: {why}")

    def fileno(self) -> int:
        return self.process.stdout.fileno()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):  # the unsent rest of a message to a process that died
                stream.close()


class RewardPool:
    """`run(jobs)` -> one `RewardOutcome` per job, in order, computed by `num_workers` processes in parallel."""

    def __init__(self, references: Sequence[str], num_workers: int, timeout_s: float | None):
        self.references, self.timeout_s = list(references), timeout_s
        self.workers = [_Worker(self.references) for _ in range(num_workers)]
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            for worker in self.workers:
                worker.wait_ready(deadline)
        except RewardStartError:
            self.close()
            raise

    def _replace(self, worker: _Worker) -> _Worker:
        worker.stop()
        fresh = _Worker(self.references)
        fresh.wait_ready(time.monotonic() + START_TIMEOUT_S)
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def run(self, jobs: Sequence[RewardJob]) -> list[RewardOutcome]:
        outcomes: list[RewardOutcome | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))[::-1]  # popped from the end: job 0 first
        killed: set[int] = set()  # jobs whose process was killed once: scored again on a fresh one
        while pending or any(w.job is not None for w in self.workers):
            for worker in self.workers:
                if worker.job is None and pending:
                    job_id = pending.pop()
                    job = jobs[job_id]
                    message = (job_id, job.function, job.response, job.answer, job.fields)
                    try:
                        send(worker.process.stdin, message)
                    except OSError:  # the worker died between calls (killed from outside): a fresh one takes it
                        worker = self._replace(worker)
                        send(worker.process.stdin, message)
                    deadline = time.monotonic() + self.timeout_s if self.timeout_s else float("inf")
                    worker.job = (job_id, deadline)
            busy = [w for w in self.workers if w.job is not None]
            nearest = min(w.job[1] for w in busy)
            wait = None if nearest == float("inf") else max(0.0, nearest - time.monotonic())
            readable, _, _ = select.select(busy, [], [], wait)
            for worker in readable:
                job_id = worker.job[0]
                answer = receive(worker.process.stdout)
                if answer is None:  # the process died inside the user's code (an exit, a crash, out of memory)
                    code = worker.process.wait()
                    worker.job = None
                    self._replace(worker)
                    if code < 0 and job_id not in killed:  # killed from outside (OOM, a node's trouble): again
                        killed.add(job_id)
                        pending.append(job_id)
                        continue
                    outcomes[job_id] = (  # an exit the code chose ends the run; a second death is the row's error
                        RewardOutcome(None, f"ended the reward process mid-call (exit code {code}); user code may "
                                            "not end the run, raise an exception instead", fatal=True) if code >= 0
                        else RewardOutcome(None, f"the reward process died mid-call twice (signal {-code}), on a "
                                                 "fresh process the second time"))
                    continue
                _, status, value = answer
                outcomes[job_id] = (RewardOutcome(value, None) if status == "ok"
                                    else RewardOutcome(None, value, fatal=status == "fatal"))
                worker.job = None
            now = time.monotonic()
            for worker in [w for w in self.workers if w.job is not None and w.job[1] <= now]:
                if worker in readable:
                    continue
                outcomes[worker.job[0]] = RewardOutcome(None, f"timed out after {self.timeout_s:g} s "
                                                              "(data.reward_timeout_s)")
                worker.job = None
                self._replace(worker)
        return outcomes  # type: ignore[return-value]

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []
