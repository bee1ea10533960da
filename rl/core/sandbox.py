"""The one door for model-written code: `run_python(code, limits)` runs it in a jail that bubblewrap builds
(`rl.core.sandbox_bwrap` has the command line and what the jail holds; `rl.core.sandbox_seccomp` the system-call
filter). Nothing else in the tree starts a process for code the model wrote.

What every run gets, whether the trainer runs as root or as an ordinary user:

- uid and gid 65534 (the only ids its user namespace maps: root is not) in user, pid, network, IPC, UTS and
  cgroup namespaces of its own; no capability (bounding set included), `no_new_privs`, no nested user namespaces;
  a seccomp filter refusing mount and umount, pivot_root, ptrace and cross-process memory calls, namespace calls
  (unshare, setns, clone with CLONE_NEW*), keyring calls, bpf, perf_event_open, userfaultfd, io_uring, kernel
  modules, kexec, swap, reboot, clock setting, raw port I/O, and sockets other than UNIX and IP ones; calls of
  another ABI kill the process;
- a read-only root holding only the system Python and the libraries it loads, a fresh /proc of its own pid
  namespace, a read-only minimal /dev, and one writable place: a tmpfs at /tmp of `file_mb` MiB in total, with the
  code at /tmp/work/main.py (working directory and HOME); nothing of the checkout, the data, the home directories,
  the run directory or the host's /proc, /tmp, /run and /etc is there, and nothing written survives the run;
- no network (only a loopback of its own), no host socket file in view, SysV IPC of its own;
- an environment of PATH, HOME, LANG and PYTHONDONTWRITEBYTECODE only;
- limits, by rlimits set inside the jail: CPU seconds (RLIMIT_CPU: SIGXCPU, then SIGKILL), address space per
  process (RLIMIT_AS: allocations past it fail), processes (RLIMIT_NPROC, counted in the jail's own user
  namespace: forks past it fail with EAGAIN), the largest file (RLIMIT_FSIZE), 64 open files, no core dumps; a
  wall-clock deadline and an output limit, past which the jail and every process in it are killed. The rlimits
  bound memory per process, so a run's memory is at most `processes` x `memory_mb` plus its `file_mb` of scratch
  (a cgroup would cap the sum at `memory_mb`; this module does not create cgroups).

A root trainer starts bwrap as the unprivileged host uid 65534 (the kernel does not apply RLIMIT_NPROC to a
process whose host uid is 0); an ordinary trainer starts it as itself, and the mount namespace, not the uid, keeps
its files out of reach.

Where the machine cannot give these guarantees `isolation()` says which and why: no bubblewrap, no user namespaces
or the system Python missing (no jail at all), or no seccomp filter (a CPU other than x86_64, or a kernel that
refuses it). `run_python` then raises SandboxUnavailable with the reason, and the trainer refuses a run whose
reward runs model code before anything starts, unless `environment.sandbox.allow_weaker_isolation` is true: then
a run without the filter goes in the jail without it, and without a jail the code runs in a plain child process
with the rlimits, deadline, output limit, a fresh scratch directory as working directory and an empty environment,
but sees and may write whatever the trainer's user can (as uid 65534 when the trainer is root).

Not guaranteed: against kernel exploits (a bug in a system call the filter allows escapes any namespace jail) and
timing or CPU-cache side channels; the number of files in scratch (its bytes are capped; the kernel memory of many
empty files is freed when the run ends); CPU time beyond `cpu_s` per process (`processes` x `cpu_s` in all, within
the wall clock).
"""

from __future__ import annotations

import functools
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

from rl.core import sandbox_bwrap, sandbox_seccomp
from rl.core.sandbox_bwrap import JAIL_ID, PYTHON

NOBODY = JAIL_ID
MIN_BWRAP = (0, 8, 0)
WEAKER_ISOLATION_KEY = "environment.sandbox.allow_weaker_isolation"
WEAKER_ISOLATION_VARIABLE = "RLPOST_SANDBOX_ALLOW_WEAKER_ISOLATION"  # how the key reaches the reward processes


class SandboxUnavailable(RuntimeError):
    """This machine cannot confine a run as `run_python` promises (the message says why and how to fix it)."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use.

    Attributes:
        wall_s: seconds of wall time before the run (all its processes) is killed.
        cpu_s: CPU seconds per process (RLIMIT_CPU); past it the kernel kills the process.
        memory_mb: address space per process, MiB (RLIMIT_AS); allocations past it fail (MemoryError).
        processes: processes of the run, its first one included (RLIMIT_NPROC in the jail's user namespace): a fork
            bomb's forks fail with EAGAIN past it.
        output_bytes: stdout and stderr kept, each; a run printing more is killed and marked `output_truncated`.
        file_mb: the scratch tmpfs's total size, MiB (all the run writes; ENOSPC past it), and the largest file
            (RLIMIT_FSIZE).
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
    "killed" (by a signal: the CPU limit, the seccomp filter, or the kernel) or "output_limit" (printed past
    output_bytes). `returncode` is 128 + N for a run killed by signal N, -9 for one killed at its deadline."""

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


@dataclass(frozen=True)
class Isolation:
    """What this machine can give: `jail` says why no jail can be built here (None: it can), `seccomp` why the
    jail gets no seccomp filter here (None: it does)."""

    jail: str | None = None
    seccomp: str | None = None

    @property
    def problem(self) -> str | None:
        return self.jail or self.seccomp

    def weaker(self) -> str:
        """What a run gets with environment.sandbox.allow_weaker_isolation=true."""
        if self.jail:
            return ("model-written code runs unconfined (a child process with the limits and an empty environment, "
                    "but able to read and write what the trainer's user can, and to reach the network)")
        if self.seccomp:
            return ("model-written code runs in the jail without its seccomp filter (mount, ptrace, keyring, "
                    "namespace, bpf and perf system calls are refused only by the dropped capabilities)")
        return "nothing is weakened: this machine gives every guarantee"


_BOOT = r"""
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
for name, value in cfg["limits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
os.execv(cfg["python"], [cfg["python"], "-I", "main.py"])
"""


def allow_weaker_isolation(allowed: bool) -> None:
    """Sets environment.sandbox.allow_weaker_isolation for this process and the processes it starts afterwards."""
    if allowed:
        os.environ[WEAKER_ISOLATION_VARIABLE] = "1"
    else:
        os.environ.pop(WEAKER_ISOLATION_VARIABLE, None)


def _weaker_allowed() -> bool:
    return os.environ.get(WEAKER_ISOLATION_VARIABLE) == "1"


def runs_model_code(function):
    """Marks a reward function that runs model-written code through `run_python`: the trainer refuses it before
    anything starts where the jail is unavailable (unless environment.sandbox.allow_weaker_isolation)."""
    function.runs_model_code = True
    return function


@functools.cache
def isolation() -> Isolation:
    """What this machine can give (probed once per process: one jailed run with the filter, one without if that
    fails)."""
    if not sys.platform.startswith("linux"):
        return Isolation(jail=f"the jail needs Linux namespaces; this is {sys.platform}")
    if _bwrap() is None:
        return Isolation(jail="the jail needs bubblewrap (`bwrap`), which is not installed here: apt-get install "
                              "bubblewrap (./bazelw installs it)")
    version = _bwrap_version()
    if version < MIN_BWRAP:
        return Isolation(jail=f"the jail needs bubblewrap >= {'.'.join(map(str, MIN_BWRAP))} (--disable-userns, "
                              f"--size); {_bwrap()} is {'.'.join(map(str, version)) or 'of an unknown version'}")
    try:
        sandbox_bwrap.interpreter_paths()
    except sandbox_bwrap.InterpreterProblem as error:
        return Isolation(jail=str(error))
    no_filter = sandbox_seccomp.filter_problem()
    jail = _jail_problem(with_filter=no_filter is None)
    if jail is None or no_filter is not None:
        return Isolation(jail=jail, seccomp=no_filter)
    if _jail_problem(with_filter=False) is None:
        return Isolation(seccomp=f"the kernel refused the jail's seccomp filter ({jail})")
    return Isolation(jail=jail)


def sandbox_problem() -> str | None:
    """Why runs cannot get every guarantee here, or None when they can."""
    return isolation().problem


def _bwrap() -> str | None:
    return shutil.which("bwrap", path=os.pathsep.join((os.environ.get("PATH", ""), "/usr/bin", "/bin")))


def _bwrap_version() -> tuple[int, ...]:
    try:
        said = subprocess.run([_bwrap(), "--version"], capture_output=True, text=True, timeout=30).stdout
        return tuple(int(part) for part in said.split()[-1].split("."))
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return ()


def _jail_problem(with_filter: bool) -> str | None:
    """Why a trivial jailed run fails here, or None."""
    try:
        probe = _jailed("print('ok')", SandboxLimits(wall_s=30, cpu_s=10), "", with_filter)
    except PermissionError as error:
        # root inside a nested user namespace (a container's, a build sandbox's) where uid 65534 is not mapped
        return (f"the trainer runs as root but cannot start the jail as the unprivileged uid {NOBODY} "
                f"({error.strerror}); run it where that uid exists (outside a nested user namespace) or as a "
                "non-root user")
    if probe.ok and probe.stdout == "ok\n":
        return None
    said = probe.stderr.strip()[-300:] or f"exit {probe.returncode}"
    return (f"bubblewrap could not build the jail ({said}); user namespaces must be available to unprivileged "
            "users (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; a container needs "
            "a seccomp profile that allows them)")


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), stdin: str = "") -> SandboxResult:
    """Runs `code` as a Python program in the jail. Raises SandboxUnavailable (saying why) where the jail cannot
    give every guarantee, unless environment.sandbox.allow_weaker_isolation is set."""
    found = isolation()
    if found.problem and not _weaker_allowed():
        raise SandboxUnavailable(f"{found.problem}. With {WEAKER_ISOLATION_KEY}=true {found.weaker()}.")
    if found.jail:
        return _unconfined(code, limits, stdin)
    return _jailed(code, limits, stdin, with_filter=found.seccomp is None)


def _rlimits(limits: SandboxLimits, processes: int) -> dict[str, int]:
    return {"RLIMIT_CPU": limits.cpu_s, "RLIMIT_AS": limits.memory_mb << 20, "RLIMIT_NPROC": processes,
            "RLIMIT_FSIZE": limits.file_mb << 20, "RLIMIT_NOFILE": 64, "RLIMIT_CORE": 0}


def _boot(limits: dict[str, int]) -> list[str]:
    return [PYTHON, "-I", "-S", "-c", _BOOT, json.dumps({"python": PYTHON, "limits": limits})]


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _drop() -> dict:
    """Popen arguments that start the jail (or the unconfined process) as uid 65534 when the trainer is root."""
    if os.geteuid() != 0:
        return {}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


def _jailed(code: str, limits: SandboxLimits, stdin: str, with_filter: bool) -> SandboxResult:
    code_fd = _memfd("main.py", code.encode())
    filter_fd = _memfd("seccomp", sandbox_seccomp.compiled()) if with_filter else None
    fds = (code_fd,) if filter_fd is None else (code_fd, filter_fd)
    try:
        # counted in the jail's own user namespace: the run's processes and the jail's init (bwrap), nothing else
        command = sandbox_bwrap.jail_command(_bwrap(), limits.file_mb, code_fd, filter_fd,
                                             _boot(_rlimits(limits, limits.processes + 1)))
        return _run(command, limits, stdin, pass_fds=fds, env={"PATH": "/usr/bin:/bin"}, **_drop())
    finally:
        for fd in fds:
            os.close(fd)


def _own_processes() -> int:
    """Processes of the uid the unconfined process runs as (RLIMIT_NPROC counts them all there)."""
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                continue
    return count


def _unconfined(code: str, limits: SandboxLimits, stdin: str) -> SandboxResult:
    """environment.sandbox.allow_weaker_isolation without a jail: a child process with the limits, in a scratch
    directory of its own (removed afterwards), with an empty environment."""
    scratch = tempfile.mkdtemp(prefix="rl-sandbox-", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        with open(os.path.join(scratch, "main.py"), "w") as handle:
            handle.write(code)
        if os.geteuid() == 0:
            os.chown(scratch, NOBODY, NOBODY)
            os.chown(os.path.join(scratch, "main.py"), NOBODY, NOBODY)
        os.chmod(scratch, 0o700)
        command = _boot(_rlimits(limits, _own_processes() + limits.processes))
        return _run(command, limits, stdin, cwd=scratch, env=dict(sandbox_bwrap.ENV, HOME=scratch), **_drop())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(command: list[str], limits: SandboxLimits, stdin: str, **popen) -> SandboxResult:
    started = time.monotonic()
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True, **popen)
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
    """SIGKILL to bwrap and its session: the jail's init dies with it (--die-with-parent), and with it every process
    of the jail's pid namespace."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
