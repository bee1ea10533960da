"""Waiting on calls to the run's actors with a limit (`trainer.actor_call_timeout_s`): a call that has not answered
in time ends the run naming the actors that did not answer, instead of a run that hangs; and work on a daemon thread
of its own, waited on later (`in_daemon_thread`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any


class ActorHung(Exception):
    def __init__(self, names: Sequence[str], timeout_s: float):
        self.names = list(names)
        super().__init__(f"{', '.join(names)} did not answer within {timeout_s:g} s "
                         "(trainer.actor_call_timeout_s)")


def first_line(error: Exception) -> str:
    """The first line of an exception's message (Ray's about a dead actor: "The actor died unexpectedly before
    finishing this task."); its type's name when it has none."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def wait_all(refs: Sequence[Any], names: Sequence[str], timeout_s: float | None) -> list[Any]:
    """`ray.get(refs)`, or ActorHung naming the actor of each ref still pending after `timeout_s` (None: no limit)."""
    import ray

    try:
        return ray.get(list(refs), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        raise ActorHung([name for ref, name in zip(refs, names, strict=True) if ref not in ready],
                        timeout_s) from None


def in_daemon_thread(work: Callable[[], Any], name: str) -> Future:
    """`work()` on a daemon thread of its own; its result or exception in the future."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as error:  # the future carries it to whoever waits on it
            future.set_exception(error)

    threading.Thread(target=run, daemon=True, name=name).start()
    return future
