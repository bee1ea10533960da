"""A sandbox for model-written code: each run in a process of its own, with no network, no writes outside a scratch
directory, limits on CPU seconds, memory, processes, file size and output, and killed at its deadline.

The mechanism is Linux namespaces (util-linux's `unshare`) and rlimits, nothing to install beyond util-linux:

- `unshare --user --map-root-user --net --mount --pid --fork --kill-child`: a network namespace with no interface
  up (no connection leaves it), a mount namespace of its own, and a pid namespace whose init is killed with its
  parent (so the whole tree of the run dies at the deadline, a fork bomb's included).
- The process runs under an unprivileged uid (`nobody`, when the trainer runs as root; the trainer's own uid
  otherwise), so the files of the system and of the trainer's user (owner-writable only) cannot be written.
- Inside, /tmp, /var/tmp and /dev/shm are replaced by small private tmpfs mounts (the world-writable places, and
  where other runs' scratch directories live), the run's scratch directory is bound at /tmp/work and is its working
  directory and HOME, and /proc shows only the run's own processes.
- rlimits: CPU seconds (RLIMIT_CPU), address space (RLIMIT_AS), processes (RLIMIT_NPROC, counted per uid), the size
  of any file written (RLIMIT_FSIZE), open files, no core dumps. Output past the limit is cut and the run killed.

Where user namespaces are not available, `sandbox_problem()` says why and `run_python` refuses with that reason:
the code is never run unconfined.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

PYTHON = "/usr/bin/python3"  # outside any user's home, so the unprivileged uid can run it
NOBODY = 65534


class SandboxUnavailable(RuntimeError):
    """This machine cannot confine a run (no user namespaces, no `unshare`, no system Python)."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use.

    Attributes:
        wall_s: seconds of wall time before the run (all its processes) is killed.
        cpu_s: CPU seconds (RLIMIT_CPU); past it the kernel kills the process.
        memory_mb: address space per process, MiB (RLIMIT_AS); allocations past it fail (MemoryError).
        processes: processes of the sandbox's uid (RLIMIT_NPROC): a fork bomb's forks fail past it.
        output_bytes: stdout and stderr kept, each; a run printing more is killed and marked `output_truncated`.
        file_mb: largest file the run may write, MiB (RLIMIT_FSIZE); also the size of its private /tmp.
    """

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    processes: int = 32
    output_bytes: int = 64 * 1024
    file_mb: int = 16


@dataclass
class SandboxResult:
    """How a run ended: `status` is "ok" (exit 0), "error" (a non-zero exit), "timeout" (killed at wall_s),
    "killed" (by a signal: the CPU limit, or the kernel) or "output_limit" (printed past output_bytes)."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    output_truncated: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


_BOOT = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
mount(None, "/", None, MS_REC | MS_PRIVATE)
work = os.open(cfg["scratch"], os.O_RDONLY | os.O_DIRECTORY)
size = f"size={cfg['file_mb']}m,mode=1777"
for place in ("/tmp", "/var/tmp", "/dev/shm"):
    if os.path.isdir(place):
        mount("tmpfs", place, "tmpfs", MS_NOSUID | MS_NODEV, size)
os.mkdir("/tmp/work")
mount(f"/proc/self/fd/{work}", "/tmp/work", None, MS_BIND)
os.close(work)
mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
os.chdir("/tmp/work")
for name, value in cfg["limits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
env = {"HOME": "/tmp/work", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
# the code runs as a child of the namespace's init (the kernel spares an init signals it does not handle, the CPU
# limit's included); when the child ends, init exits and the kernel kills whatever else is left in the namespace
child = os.fork()
if child == 0:
    os.execve(cfg["python"], [cfg["python"], "-I", "main.py"], env)
_, status = os.waitpid(child, 0)
os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
"""


def sandbox_problem() -> str | None:
    """Why runs cannot be confined here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux namespaces; this is {sys.platform}"
    if shutil.which("unshare") is None:
        return "the sandbox needs util-linux's `unshare` (apt-get install util-linux)"
    if not os.access(PYTHON, os.X_OK):
        return f"the sandbox runs code with the system Python {PYTHON}, which is missing (apt-get install python3)"
    try:
        probe = subprocess.run(_command(["/bin/true"]), capture_output=True, text=True, timeout=30, **_drop())
    except PermissionError as error:
        # e.g. root inside a container's or a build sandbox's user namespace, where uid nobody is not mapped; as
        # root, RLIMIT_NPROC would not hold a fork bomb, so no run is made at all
        return (f"the trainer runs as root but cannot switch the sandbox to the unprivileged uid {NOBODY} "
                f"({error.strerror}); run it where that uid exists (outside a nested user namespace) or as a "
                "non-root user")
    if probe.returncode != 0:
        return ("user namespaces are not available here (`unshare --user --net --mount --pid` failed: "
                f"{probe.stderr.strip()[:200]}); enable them (sysctl kernel.unprivileged_userns_clone=1, or "
                "user.max_user_namespaces > 0), or run the trainer where they are")
    return None


def _command(program: list[str]) -> list[str]:
    return ["unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child", "--",
            *program]


def _drop() -> dict:
    """Popen arguments that run the sandbox under `nobody` when the trainer is root."""
    if os.geteuid() != 0:
        return {}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


def _own_processes() -> int:
    """Processes of the uid the sandbox runs as (RLIMIT_NPROC counts them all)."""
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), stdin: str = "") -> SandboxResult:
    """Runs `code` as a Python program in the sandbox; its scratch directory is removed afterwards. Raises
    SandboxUnavailable (saying why) where runs cannot be confined."""
    problem = _checked()
    if problem:
        raise SandboxUnavailable(problem)
    # under /tmp, not $TMPDIR: the unprivileged uid must reach it (a test runner's TMPDIR may sit in root's home)
    scratch = tempfile.mkdtemp(prefix="rl-sandbox-", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        with open(os.path.join(scratch, "main.py"), "w") as handle:
            handle.write(code)
        if os.geteuid() == 0:
            os.chown(scratch, NOBODY, NOBODY)
            os.chown(os.path.join(scratch, "main.py"), NOBODY, NOBODY)
        os.chmod(scratch, 0o700)
        return _run(scratch, limits, stdin)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


_CHECKED: list[str | None] = []


def _checked() -> str | None:
    if not _CHECKED:
        _CHECKED.append(sandbox_problem())
    return _CHECKED[0]


def _run(scratch: str, limits: SandboxLimits, stdin: str) -> SandboxResult:
    rlimits = {"RLIMIT_CPU": limits.cpu_s, "RLIMIT_AS": limits.memory_mb << 20,
               "RLIMIT_NPROC": _own_processes() + limits.processes, "RLIMIT_FSIZE": limits.file_mb << 20,
               "RLIMIT_NOFILE": 64, "RLIMIT_CORE": 0}
    boot = {"scratch": scratch, "file_mb": limits.file_mb, "limits": rlimits, "python": PYTHON}
    started = time.monotonic()
    process = subprocess.Popen(_command([PYTHON, "-I", "-c", _BOOT, json.dumps(boot)]), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                               env={"PATH": "/usr/bin:/bin"}, **_drop())
    over = threading.Event()
    outputs = [bytearray(), bytearray()]
    readers = [threading.Thread(target=_drain, args=(pipe, out, limits.output_bytes, over), daemon=True)
               for pipe, out in zip((process.stdout, process.stderr), outputs, strict=True)]
    for reader in readers:
        reader.start()
    try:
        process.stdin.write(stdin.encode())
        process.stdin.close()
    except BrokenPipeError:
        pass
    deadline = started + limits.wall_s
    timed_out = False
    while process.poll() is None:
        if over.is_set() or time.monotonic() > deadline:
            timed_out = not over.is_set()
            _kill(process)
            break
        time.sleep(0.02)
    process.wait()
    for reader in readers:
        reader.join(5)
    elapsed = time.monotonic() - started
    code = process.returncode
    stdout, stderr = (bytes(out).decode(errors="replace") for out in outputs)
    if over.is_set():
        status = "output_limit"
    elif timed_out:
        status = "timeout"
    elif code is not None and (code < 0 or code > 128):  # 128 + N: killed by signal N (SIGXCPU: the CPU limit)
        status = "killed"
    else:
        status = "ok" if code == 0 else "error"
    return SandboxResult(status, code, stdout, stderr, elapsed, over.is_set())


def _drain(pipe, out: bytearray, limit: int, over: threading.Event) -> None:
    while True:
        chunk = pipe.read1(65536) if hasattr(pipe, "read1") else pipe.read(65536)
        if not chunk:
            return
        room = limit - len(out)
        out.extend(chunk[:max(room, 0)])
        if len(chunk) > room:
            over.set()
            return


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL to `unshare` and its session: the namespace's init dies with it (--kill-child), and with it every
    process of the namespace."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
