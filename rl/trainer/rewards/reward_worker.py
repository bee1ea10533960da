"""One reward process of `RewardPool`: loads the configured reward functions once, then scores jobs read from stdin.

Messages are length-prefixed pickles. The first one in is the list of references; the worker answers `"ready"` or
`("failed", text)`. Then each job `(job_id, function_index, response, answer, fields)` is answered with
`(job_id, "ok", (score, extras))` or `(job_id, "error", text)`. The protocol owns the real stdout: what the user's
code prints goes to stderr (the run's log), so a stray print cannot corrupt an answer.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import IO, Any

HEADER = struct.Struct("<Q")


def send(stream: IO[bytes], message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(payload)) + payload)
    stream.flush()


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(stream: IO[bytes]) -> Any:
    """The next message, or None at end of stream (the other side closed or died)."""
    header = _read_exactly(stream, HEADER.size)
    if header is None:
        return None
    payload = _read_exactly(stream, HEADER.unpack(header)[0])
    return None if payload is None else pickle.loads(payload)


def main() -> None:
    import signal

    from rl.backends.lifeline import exit_with_parent

    # A Ctrl-C in a terminal reaches the whole process group: the driver stops these processes, so they ignore it
    # (no KeyboardInterrupt tracebacks of theirs in the run's log).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()  # a hung reward must not outlive the run
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    jobs = sys.stdin.buffer
    references = receive(jobs)
    try:
        from rl.core.rewards.functions import call_reward, failure_text, load_reward_function
        from rl.core.user_code import UserExit, exit_text
        from rl.tasks import rewards as _task_rewards  # noqa: F401  (registers the tasks' reward functions)

        functions = [load_reward_function(reference) for reference in references]
    except (Exception, SystemExit, KeyboardInterrupt) as error:  # reported to the driver, which names the key
        send(answers, ("failed", exit_text(error)))
        return
    send(answers, "ready")
    while (job := receive(jobs)) is not None:
        job_id, index, response, answer, fields = job
        try:
            send(answers, (job_id, "ok", call_reward(functions[index], response, answer, fields)))
        except UserExit as error:  # ends the run whatever data.reward_on_error says
            send(answers, (job_id, "fatal", str(error)))
        except Exception as error:  # the driver decides: zero and count it, or end the run
            send(answers, (job_id, "error", failure_text(error)))


if __name__ == "__main__":
    main()
