"""A checkpoint or export that cannot be written (a full disk, a quota, a read-only or vanished mount) ends the run
with one line: what was being written and where, the error, the free space of that filesystem; `rl.trainer.run`
adds the step and the last complete checkpoint. The half-written directory is removed first, so no partial copy
is left for a resume or a user to pick up, and the space it held is free again."""

from __future__ import annotations

import contextlib
import os
import shutil

_SHORT_WRITE_TEXTS = ("file write failed", "unexpected pos")  # torch's zip writer, which drops the errno
# How a failed write reads when the OSError itself is not at hand: torch's zip writer turns a short write into
# "unexpected pos ..." or "file write failed", safetensors reports Rust's io::ErrorKind names, and an error raised
# in a Ray actor reaches the driver as text when it could not be pickled.
_WRITE_FAILURE_TEXTS = ("No space left on device", "StorageFull", "Disk quota exceeded", "QuotaExceeded",
                        "Read-only file system", "ReadOnlyFilesystem", *_SHORT_WRITE_TEXTS)


class WriteFailed(RuntimeError):
    """A checkpoint or export could not be written; the message is the line the run ends with (less the step)."""


def write_failure(error: BaseException) -> BaseException | None:
    """The failed write inside `error` (itself, its cause chain, a Ray task error's cause, or one of the per-rank
    failures torch.distributed.checkpoint collects), or None when `error` is some other failure."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) or any(text in str(current) for text in _WRITE_FAILURE_TEXTS):
            return current
        todo += [getattr(current, "cause", None), current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)  # CheckpointException: rank -> the exception raised there
        if isinstance(failures, dict):
            todo += [f for f in failures.values() if isinstance(f, BaseException)]
    return None


def describe(failure: BaseException) -> str:
    """The error in one line: an OSError's errno and text with its file, else the line that names the failure."""
    if isinstance(failure, OSError) and failure.strerror:
        where = f": {failure.filename}" if failure.filename else ""
        return f"[Errno {failure.errno}] {failure.strerror}{where}"
    lines = [line.strip() for line in str(failure).splitlines() if line.strip()]
    for line in lines:
        if any(text in line for text in _WRITE_FAILURE_TEXTS):
            return line
    return lines[0] if lines else type(failure).__name__


FULL_BYTES = 1 << 20
"""A write cut short with less than this free on its filesystem ran out of space (torch's zip writer says only
"unexpected pos" or "file write failed")."""


def disk_usage(path: str):
    """shutil.disk_usage of the filesystem that holds `path` (its nearest existing ancestor), None when unreadable."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    try:
        return shutil.disk_usage(existing)
    except OSError:
        return None


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def write_failed(what: str, path: str, failure: BaseException, partial: str, key: str) -> WriteFailed:
    """Removes the half-written `partial` directory and says what could not be written where, and why; `key` is
    the config key that moves it elsewhere."""
    usage = disk_usage(path)  # as the write found it, before the partial's space is given back
    shutil.rmtree(partial, ignore_errors=True)
    error = describe(failure)
    if any(text in str(failure) for text in _SHORT_WRITE_TEXTS):
        full = usage is not None and usage.free < FULL_BYTES
        error = f"No space left on device (the writer said: {error})" if full else f"{error} (a write was cut short)"
    space = f"{_size(usage.free)} free of {_size(usage.total)}" if usage else ""
    return WriteFailed(f"{what} could not be written to {path}: {error}; "
                       f"{f'its filesystem had {space} when the write failed; ' if space else ''}the partial "
                       f"{partial} was removed (free space there or set {key} to another disk)")


@contextlib.contextmanager
def one_line(what: str, path: str, partial: str, key: str):
    """Runs the block that writes `what` to `path` (staged in `partial`); a failed write leaves it as WriteFailed
    (`write_failed`), any other error as it was."""
    try:
        yield
    except Exception as error:
        failure = write_failure(error)
        if failure is None:
            raise
        raise write_failed(what, path, failure, partial, key) from None
