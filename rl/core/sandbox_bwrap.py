"""The jail's command line: bubblewrap (`bwrap`, Debian's `bubblewrap` package, which ./bazelw installs), run
unprivileged, builds it from nothing. `jail_command` returns

    bwrap --unshare-all --unshare-user --disable-userns --assert-userns-disabled --uid 65534 --gid 65534
          --hostname jail --die-with-parent --new-session --cap-drop ALL
          --clearenv --setenv PATH /usr/bin:/bin --setenv HOME /tmp/work --setenv LANG C.UTF-8
          --setenv PYTHONDONTWRITEBYTECODE 1
          [--symlink / --ro-bind of the interpreter's files: `read_only_view(interpreter_paths())`]
          --proc /proc --dev /dev --remount-ro /dev
          --size <file_mb MiB> --tmpfs /tmp --dir /tmp/work --file <fd> /tmp/work/main.py --chdir /tmp/work
          --remount-ro / [--seccomp <fd>] -- /usr/bin/python3 -I -S -c <boot> <limits>

- new user, pid, network, IPC, UTS and cgroup namespaces; inside them uid and gid 65534 (the only ids the user
  namespace maps: root is not), every capability dropped (bounding set included), `no_new_privs`, no further user
  namespaces, and the seccomp filter of `rl.core.sandbox_seccomp`;
- a root of its own (a tmpfs, read-only once built) holding only what the interpreter needs, bound read-only:
  itself, its standard library, the directories of the shared libraries it loads, and its ELF loader (the symlinks
  on the way recreated); no /etc, /home, /root, /run, /var, no checkout, data or run directory;
- a fresh /proc of its own pid namespace; a minimal /dev (null, zero, random, urandom, tty, ...) read-only, so
  /dev/shm cannot be written;
- one writable place: a tmpfs at /tmp capped at `file_mb` MiB in total, with the code at /tmp/work/main.py (its
  working directory and HOME); it vanishes with the run;
- a network namespace with only loopback (no route out; the host's listening ports and abstract UNIX sockets are
  not in it, and no socket file of the host is in the view); its own SysV IPC and POSIX message queues;
- an environment of PATH, HOME, LANG and PYTHONDONTWRITEBYTECODE only; `--die-with-parent`: the jail dies with
  the trainer; `--new-session`: no terminal to push input into.

The interpreter is the system's Python (`/usr/bin/python3`, outside every user's home, so the jail is the same
whether the trainer runs as root or as an ordinary user); model-written code gets its standard library only.
"""

from __future__ import annotations

import functools
import json
import os
import struct
import subprocess

PYTHON = "/usr/bin/python3"
JAIL_ID = 65534  # the uid and gid inside the jail (and the host uid a root trainer starts bwrap as)
WORK = "/tmp/work"
ENV = {"PATH": "/usr/bin:/bin", "HOME": WORK, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}

# Run once, unconfined, with the system Python: what it loads (its standard library, the shared libraries of its
# interpreter and of the extension modules a program commonly imports).
_PROBE = r"""
import json, sys, sysconfig
for name in ("_decimal", "zlib", "_ctypes", "_hashlib", "_ssl", "_bz2", "_lzma", "_sqlite3", "_uuid", "pyexpat",
             "_json", "math", "_datetime", "array", "select", "_socket"):
    try:
        __import__(name)
    except ImportError:
        pass
mapped = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        path = line.split()[-1]
        if path.startswith("/") and ".so" in path.rsplit("/", 1)[-1]:
            mapped.add(path.rsplit("/", 1)[0])
stdlib = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
print(json.dumps({"stdlib": sorted(stdlib), "libraries": sorted(mapped), "executable": sys.executable}))
"""


class InterpreterProblem(RuntimeError):
    """The system Python could not be inspected (missing, or it failed)."""


def elf_interpreter(path: str) -> str | None:
    """The ELF loader a 64-bit little-endian executable names (PT_INTERP), or None."""
    with open(path, "rb") as binary:
        header = binary.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return None
        phoff, = struct.unpack_from("<Q", header, 32)
        entry_size, count = struct.unpack_from("<HH", header, 54)
        for index in range(count):
            binary.seek(phoff + index * entry_size)
            entry = binary.read(entry_size)
            kind, = struct.unpack_from("<I", entry, 0)
            if kind == 3:  # PT_INTERP
                offset, = struct.unpack_from("<Q", entry, 8)
                size, = struct.unpack_from("<Q", entry, 32)
                binary.seek(offset)
                return binary.read(size).rstrip(b"\0").decode()
    return None


@functools.cache
def interpreter_paths() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(directories, files) of the host the jail's interpreter needs, read-only. Raises InterpreterProblem."""
    if not os.access(PYTHON, os.X_OK):
        raise InterpreterProblem(f"the jail runs code with the system Python {PYTHON}, which is missing "
                                 "(apt-get install python3; ./bazelw installs it)")
    try:
        probe = subprocess.run([PYTHON, "-I", "-S", "-c", _PROBE], capture_output=True, text=True, timeout=60,
                               env={"PATH": ENV["PATH"]})
        found = json.loads(probe.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as error:
        raise InterpreterProblem(f"the system Python {PYTHON} could not be inspected: {error}") from None
    loader = elf_interpreter(os.path.realpath(PYTHON))
    files = (PYTHON, *([loader] if loader else []))
    return tuple(dict.fromkeys(found["stdlib"] + found["libraries"])), files


def read_only_view(directories: tuple[str, ...], files: tuple[str, ...]) -> list[str]:
    """bwrap arguments under which each host path resolves in the jail as on the host, read-only: each symlink on
    the way is recreated as a symlink, the real directory or file is bound read-only (directories first; a path
    inside one already bound needs nothing more)."""
    args: list[str] = []
    bound: list[str] = []
    linked: set[str] = set()

    def inside_bound(path: str) -> bool:
        return any(path == top or path.startswith(top.rstrip("/") + "/") for top in bound)

    def expose(path: str, hops: int = 0) -> None:
        if hops > 40:
            raise InterpreterProblem(f"too many symlinks resolving {path}")
        parts = os.path.normpath(path).strip("/").split("/")
        current = "/"
        for index, part in enumerate(parts):
            current = os.path.join(current, part)
            if inside_bound(current):
                return
            if os.path.islink(current):
                target = os.readlink(current)
                if current not in linked:
                    linked.add(current)
                    args.extend(["--symlink", target, current])
                expose(os.path.join(os.path.dirname(current), target, *parts[index + 1:]), hops + 1)
                return
        bound.append(current)
        args.extend(["--ro-bind", current, current])

    for path in (*directories, *files):
        expose(path)
    return args


def jail_command(bwrap: str, scratch_mb: int, code_fd: int, filter_fd: int | None, program: list[str]) -> list[str]:
    """The bwrap command line that runs `program` in the jail (module docstring). `code_fd` holds main.py,
    `filter_fd` the compiled seccomp filter (None: none)."""
    environment = [arg for name, value in ENV.items() for arg in ("--setenv", name, value)]
    seccomp = ["--seccomp", str(filter_fd)] if filter_fd is not None else []
    return [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--assert-userns-disabled",
            "--uid", str(JAIL_ID), "--gid", str(JAIL_ID), "--hostname", "jail",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv", *environment,
            *read_only_view(*interpreter_paths()),
            "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
            "--size", str(scratch_mb << 20), "--tmpfs", "/tmp", "--dir", WORK,
            "--file", str(code_fd), f"{WORK}/main.py", "--chdir", WORK, "--remount-ro", "/",
            *seccomp, "--", *program]
