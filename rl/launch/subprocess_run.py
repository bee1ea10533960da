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


def run_train(run_dir: str, overrides: list[str], *, threads: int = 1, timeout: float | None = None,
              env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m rl.launch.train --run_dir=RUN_DIR OVERRIDES...` with this interpreter and import path, each process
    of the run on `threads` torch threads; stdout and stderr captured. On timeout the run's process group is killed
    and `subprocess.TimeoutExpired` raised, carrying the output so far."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env_extra or {})}
    cmd = [sys.executable, "-m", "rl.launch.train", f"--run_dir={run_dir}", *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        stdout, stderr = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, stdout, stderr) from None
    finally:
        _kill_group(proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
