"""The local Ray cluster ends with the launcher, even when the launcher is SIGKILLed.

Ray's own fate sharing stops the GCS and the raylet when the driver dies, but the agents the raylet started
(dashboard and runtime-env agents) notice only when their health checks time out, about a minute later. A watcher
in a session of its own (so a signal to the launcher's process group leaves it standing) notes the launcher's
descendants every second and waits for the launcher's end of a pipe to close, which happens however the launcher
ends; then it kills every process it noted that still runs (the same pid and start time), and every process that
carries the launcher's tag in its environment (the ones started since the last look; Ray's agents overwrite
their environment block with their process title, so the tag alone does not find them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

TAG_VARIABLE = "RL_RAY_LIFELINE"

# Standard library only, run with -I -S: it starts in milliseconds and imports nothing of the run.
_WATCHER = r"""
import os, select, signal, sys, time
entry, launcher = sys.argv[1].encode(), int(sys.argv[2])
me = os.getpid()

def table():
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                found[int(name)] = (int(fields[1]), fields[19])  # parent, start time
            except (OSError, IndexError):
                pass
    return found

def descendants(processes):
    children = {}
    for pid, (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, [launcher]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = processes[child][1]
            todo.append(child)
    return found

def tagged(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False

noted = {}
while not select.select([sys.stdin], [], [], 1.0)[0]:
    noted.update(descendants(table()))
sys.stdin.buffer.read()
for _ in range(5):
    killed = 0
    for pid, (_, started) in table().items():
        if noted.get(pid) == started or tagged(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    if not killed:
        break
    time.sleep(0.2)
"""

_watcher: subprocess.Popen | None = None  # held so the pipe's write end stays open for the launcher's lifetime


def start() -> None:
    """Tags this process's future children and starts their watcher (once per process)."""
    global _watcher
    if _watcher is not None or not os.path.isdir("/proc"):
        return
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.environ[TAG_VARIABLE] = tag
    _watcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER, f"{TAG_VARIABLE}={tag}", str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
