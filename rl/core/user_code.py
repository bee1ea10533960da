"""Objects named in config that live in the user's own code: `package.module:name` or `path/to/file.py:name`
(veRL's `custom_reward_function.path` + `name` in one string), resolved at config load so that a typo, a missing
file or a module that fails to import is refused before anything expensive starts."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any


class UserCodeError(ValueError):
    """A reference that does not resolve; the message names the config key and what to fix."""


def is_reference(value: str) -> bool:
    """Whether `value` points into user code (`module:name`, `file.py:name`) rather than naming a registered entry."""
    return isinstance(value, str) and ":" in value


def split_reference(reference: str, key: str) -> tuple[str, str]:
    where, sep, name = reference.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise UserCodeError(f"{key}: '{reference}' must be 'package.module:name' or 'path/to/file.py:name' (the "
                            "part after the last ':' is the function or class to use)")
    return where, name


def _module_from_file(path: str, key: str):
    # Under `bazel run` the process runs in its runfiles: a relative path means the directory bazel ran from.
    path = os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", ""), os.path.expanduser(path))
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UserCodeError(f"{key}: file {path} does not exist")
    # One module per file (by its path), registered so that its objects pickle by reference and load once.
    module_name = f"rl_user_code_{os.path.splitext(os.path.basename(path))[0]}_" \
                  f"{hashlib.sha1(path.encode()).hexdigest()[:10]}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"{key}: {path} cannot be loaded as a Python module (it should end in .py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        with exits_as_errors():
            spec.loader.exec_module(module)
    except BaseException as error:
        del sys.modules[module_name]
        if not isinstance(error, Exception):  # a real Ctrl-C
            raise
        raise UserCodeError(f"{key}: importing {path} failed: {exit_text(error)}") from error
    return module


def _module_by_name(name: str, key: str):
    try:
        with exits_as_errors():
            return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and name.startswith(error.name):
            raise UserCodeError(f"{key}: no module named '{name}' on the Python path; give a file path "
                                "('path/to/file.py:name') or install the package") from error
        raise UserCodeError(f"{key}: importing {name} failed: {error}") from error
    except Exception as error:
        raise UserCodeError(f"{key}: importing {name} failed: {exit_text(error)}") from error


def load_object(reference: str, key: str) -> Any:
    """The object `reference` names (`package.module:name` or `path/to/file.py:name`); errors name `key`."""
    where, name = split_reference(reference, key)
    module = _module_from_file(where, key) if where.endswith(".py") or os.sep in where else _module_by_name(where, key)
    try:
        return getattr(module, name)
    except AttributeError:
        found = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise UserCodeError(f"{key}: {where} has no '{name}'" + (f"; it defines: {', '.join(found)}" if found else ""))\
            from None


# --- user code that tries to end the process -----------------------------------------------------------------------
# `SystemExit` and `KeyboardInterrupt` raised by user code become named errors; only a SIGINT that really arrived
# (counted by `counting_sigints`) stays the user's Ctrl-C.
_SIGINTS = [0]


def real_sigints() -> int:
    """How many SIGINTs arrived while `counting_sigints` was in effect."""
    return _SIGINTS[0]


def _count_sigint(signum, frame) -> None:
    _SIGINTS[0] += 1
    raise KeyboardInterrupt


class counting_sigints:
    """Within: a real SIGINT is counted (and raises KeyboardInterrupt as usual). Only in the main thread, and only
    over Python's default handler (another handler is left as it is)."""

    def __enter__(self):
        self.installed = (threading.current_thread() is threading.main_thread()
                          and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        if self.installed:
            signal.signal(signal.SIGINT, _count_sigint)
        return self

    def __exit__(self, *exc) -> None:
        if self.installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def exit_text(error: BaseException) -> str:
    """An error as a message shows it; a SystemExit or KeyboardInterrupt (or the `UserExit` made of one) with what
    to do instead."""
    if isinstance(error, UserExit):
        return str(error)
    if isinstance(error, SystemExit):
        return (f"it called sys.exit({error.code!r}) (SystemExit); user code may not end the run, raise an exception "
                "instead")
    if isinstance(error, KeyboardInterrupt):
        return "it raised KeyboardInterrupt; user code may not end the run, raise an exception instead"
    return f"{type(error).__name__}: {error}"


_IN_USER_CODE = threading.local()
_REAL_OS_EXIT = os._exit


def _os_exit_of_user_code(code: int) -> None:
    """os._exit while this thread runs user code: refused (UserExit) and remembered, so that user code that catches
    the error still ends its call as one; elsewhere (another thread, a process forked from this one) the real
    os._exit."""
    if getattr(_IN_USER_CODE, "depth", 0) <= 0 or _IN_USER_CODE.pid != os.getpid():
        _REAL_OS_EXIT(code)
    _IN_USER_CODE.exit_called = code
    raise UserExit(f"it called os._exit({code!r}); user code may not end the run, raise an exception instead")


@contextlib.contextmanager
def exits_as_errors():
    """Runs user code: a SystemExit, or a KeyboardInterrupt that no real SIGINT caused, comes out as `UserExit`
    (a real Ctrl-C still raises KeyboardInterrupt), and so does a call of os._exit on this thread (which would end
    the process, the run with it, with the user's exit code)."""
    os._exit = _os_exit_of_user_code
    sigints = real_sigints()
    _IN_USER_CODE.depth = getattr(_IN_USER_CODE, "depth", 0) + 1
    _IN_USER_CODE.exit_called, _IN_USER_CODE.pid = None, os.getpid()
    try:
        with counting_sigints():
            yield
    except (SystemExit, KeyboardInterrupt) as error:
        if isinstance(error, KeyboardInterrupt) and real_sigints() != sigints:
            raise
        raise UserExit(exit_text(error)) from error
    finally:
        _IN_USER_CODE.depth -= 1
    if _IN_USER_CODE.exit_called is not None:  # the UserExit was caught inside the user's code
        raise UserExit(f"it called os._exit({_IN_USER_CODE.exit_called!r}); user code may not end the run, raise "
                       "an exception instead")


def call_guarded(fn: Callable, *args, **kwargs):
    """`fn(*args, **kwargs)` under `exits_as_errors`."""
    with exits_as_errors():
        return fn(*args, **kwargs)


class UserExit(RuntimeError):
    """User code raised SystemExit or KeyboardInterrupt (not a real Ctrl-C): an error that ends the run."""
