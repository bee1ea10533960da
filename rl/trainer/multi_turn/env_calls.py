"""Calls into the user's environments, held to the reward functions' standard: side by side on a few threads
(`environment.max_env_workers`), each under a deadline (`environment.step_timeout_s`), with what `step` returns
checked, and every failure described by the environment's class, the data row and the turn.

A call past its deadline cannot be stopped (Python threads cannot be killed): it is abandoned on its daemon thread,
another thread takes its place, and the process does not wait for it when it exits.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rl.core.environments import StepResult
from rl.core.rewards.functions import failure_text
from rl.core.user_code import UserExit, call_guarded
from rl.trainer.rewards.rewarding import RewardError

RESULT_SHAPE = (
    "rl.core.environments.StepResult(observation=str, reward=a number, done=True/False, metrics={name: number})"
)


class EpisodeError(RewardError):
    """A multi-turn episode cannot go on: an environment call failed, timed out or returned something that is no
    StepResult (with data.reward_on_error=fail, or past what `zero` tolerates), or a prompt leaves no room; the
    message names the environment, the row and the turn, and what to change."""


class BadStepResult(ValueError):
    """`step` returned something other than a well-formed StepResult; the message says what is wrong."""


@dataclass
class Outcome:
    """One call's end: its value, the exception it raised, or that it ran past the deadline."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False

    @property
    def failed(self) -> bool:
        return self.error is not None or self.timed_out

    @property
    def fatal(self) -> bool:
        """User code that tried to end the process ends the run whatever data.reward_on_error says."""
        return isinstance(self.error, UserExit)


class CallPool:
    """Runs batches of calls on up to `workers` daemon threads, each call under `timeout_s` (None: no limit),
    counted from when a thread starts it."""

    def __init__(self, workers: int, timeout_s: float | None):
        if workers < 1:
            raise ValueError(f"environment.max_env_workers must be >= 1, got {workers}")
        self.workers, self.timeout_s = workers, timeout_s

    def run(self, calls: Sequence[Callable[[], Any]], stop_on_failure: bool = False) -> list[Outcome | None]:
        """Each call's outcome, in order. With `stop_on_failure` the batch ends at its first failure: the calls not
        finished by then are None (those running go on in the background; those not started never start)."""
        batch = _Batch(calls)
        with batch.lock:
            for _ in range(min(self.workers, len(calls))):
                batch.spawn()
            while True:
                wait = batch.expire(self.timeout_s)
                if batch.finished(stop_on_failure):
                    break
                batch.lock.wait(wait)
            batch.stopped = True
        return batch.outcomes


class _Batch:
    """One `CallPool.run`: the calls, their outcomes and start times, guarded by `lock`."""

    def __init__(self, calls: Sequence[Callable[[], Any]]):
        self.calls = list(calls)
        self.outcomes: list[Outcome | None] = [None] * len(calls)
        self.started: list[float | None] = [None] * len(calls)
        self.abandoned: set[int] = set()
        self.next = 0
        self.stopped = False
        self.lock = threading.Condition()

    def spawn(self) -> None:
        threading.Thread(target=self.work, name="environment-call", daemon=True).start()

    def work(self) -> None:
        while True:
            with self.lock:
                if self.stopped or self.next >= len(self.calls):
                    return
                index, self.next = self.next, self.next + 1
                self.started[index] = time.monotonic()
                self.lock.notify_all()  # a new deadline to watch
            outcome = _call(self.calls[index])
            with self.lock:
                if index in self.abandoned:
                    return  # another thread took this one's place when the call ran past its deadline
                self.outcomes[index] = outcome
                self.lock.notify_all()

    def finished(self, stop_on_failure: bool) -> bool:
        done = [outcome for outcome in self.outcomes if outcome is not None]
        return len(done) == len(self.calls) or (stop_on_failure and any(o.failed for o in done))

    def expire(self, timeout_s: float | None) -> float | None:
        """Marks the calls past their deadline as timed out (a new thread replaces each); returns how long to wait
        for the next deadline (None: until a call ends)."""
        if timeout_s is None:
            return None
        now, wait = time.monotonic(), None
        for index, started in enumerate(self.started):
            if started is None or self.outcomes[index] is not None:
                continue
            left = started + timeout_s - now
            if left <= 0:
                self.outcomes[index] = Outcome(timed_out=True)
                self.abandoned.add(index)
                self.spawn()
            else:
                wait = left if wait is None else min(wait, left)
        return wait


def _call(fn: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(value=call_guarded(fn))
    except Exception as error:  # every failure of user code is reported by the caller, naming where it happened
        return Outcome(error=error)


# --- what `step` returns ----------------------------------------------------------------------------------------


def checked_result(result: Any) -> StepResult:
    """`result` if it is a StepResult whose reward is a number (a non-finite one is left to trainer.non_finite),
    `done` a bool, the metrics finite numbers by name and, for an episode that goes on, the observation text;
    otherwise `BadStepResult` saying what is wrong. Nothing is converted: the text "1.0" is not a reward."""
    if not isinstance(result, StepResult):
        shown = f"{type(result).__name__} {result!r:.80}" if result is not None else "None"
        raise BadStepResult(f"returned {shown}, not a StepResult")
    if not _is_number(result.reward):
        raise BadStepResult(
            f"returned a StepResult whose reward is {type(result.reward).__name__} {result.reward!r:.60}, not a number"
        )
    if not _is_bool(result.done):
        raise BadStepResult(
            f"returned a StepResult whose done is {type(result.done).__name__} {result.done!r:.60}, not True or False"
        )
    if not isinstance(result.metrics, Mapping):
        raise BadStepResult(
            f"returned a StepResult whose metrics are {type(result.metrics).__name__}, not a dict of numbers by name"
        )
    for name, value in result.metrics.items():
        if not isinstance(name, str) or not _is_number(value) or not math.isfinite(float(value)):
            raise BadStepResult(
                f"returned the metric {name!r:.40} = {type(value).__name__} {value!r:.60}; metrics "
                "must be finite numbers named by strings"
            )
    if not result.done and not isinstance(result.observation, str):
        raise BadStepResult(
            f"returned a StepResult whose observation is {type(result.observation).__name__}, not "
            "text (the episode goes on, so the observation is the next thing the policy reads)"
        )
    return result


def _is_number(value: Any) -> bool:
    """A bool, int, float or a numpy/torch scalar; never text."""
    if isinstance(value, str | bytes) or not hasattr(value, "__float__"):
        return False
    try:
        float(value)
    except (TypeError, ValueError, OverflowError):  # e.g. a tensor of several elements, an int past float's range
        return False
    return True


def _is_bool(value: Any) -> bool:
    """True or False, or a numpy/torch boolean scalar."""
    if isinstance(value, bool):
        return True
    item = getattr(value, "item", None)
    try:
        return callable(item) and getattr(value, "dtype", None) is not None and isinstance(item(), bool)
    except (TypeError, ValueError, RuntimeError):
        return False


def describe_failure(outcome: Outcome, call: str, timeout_s: float | None) -> tuple[str, str]:
    """What went wrong with one call (follows "<Class>.<call> on <row> (<turn>)"), and how to fix it."""
    if outcome.timed_out:
        return (
            f"ran past environment.step_timeout_s={timeout_s:g} s and was abandoned",
            f"make {call} faster or raise environment.step_timeout_s",
        )
    error = outcome.error
    if isinstance(error, BadStepResult):
        return str(error), f"step must return {RESULT_SHAPE}"
    if isinstance(error, UserExit):
        return f"tried to end the process: {error}", ""
    fix = "fix the class or environment.env_options" if call == "__init__" else f"fix its {call}"
    return f"raised {failure_text(error)}", fix
