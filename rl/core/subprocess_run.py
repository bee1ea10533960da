"""Running the training launcher as a child process: for sweeps, benchmarks and tests.

The child gets its own process group, killed once it has exited or timed out: a driver that dies by SIGKILL (or is
killed on timeout) cannot shut down the Ray processes it started, and one of those holding the output pipes open
would otherwise block the reader.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


def start_train(run_dir: str, overrides: list[str], *, threads: int = 1, env_extra: dict | None = None,
                output=subprocess.PIPE, module: str = "rl.launch.train") -> subprocess.Popen:
    """`python -m rl.launch.train --run_dir=RUN_DIR OVERRIDES...` started with this interpreter and import path in a
    process group of its own, each process of the run on `threads` torch threads; stdout and stderr go to `output`
    (pipes by default: read them, or pass open files for a run that is not waited on). `module`: another launcher
    with the same flags (`rl.launch.sft`, `rl.launch.dpo`)."""
    return subprocess.Popen(launcher_command(run_dir, overrides, module), stdout=output, stderr=output, text=True,
                            env=launcher_env(threads, env_extra), start_new_session=True)


def launcher_command(run_dir: str, overrides: list[str], module: str = "rl.launch.train") -> list[str]:
    return [sys.executable, "-m", module, f"--run_dir={run_dir}", *overrides]


def launcher_env(threads: int = 1, env_extra: dict | None = None) -> dict[str, str]:
    """This process's environment and import path, each process of the run on `threads` torch threads."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env_extra or {})}


def run_train(run_dir: str, overrides: list[str], *, threads: int = 1, timeout: float | None = None,
              env_extra: dict | None = None, module: str = "rl.launch.train") -> subprocess.CompletedProcess:
    """`start_train`, waited for; stdout and stderr captured. On timeout the run's process group is killed and
    `subprocess.TimeoutExpired` raised, carrying the output so far."""
    proc = start_train(run_dir, overrides, threads=threads, env_extra=env_extra, module=module)
    cmd = proc.args
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr) from None
    finally:
        kill_group(proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def kill_group(pid: int) -> None:
    """SIGKILL to the process group of a run started by `start_train` (its Ray processes included)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
