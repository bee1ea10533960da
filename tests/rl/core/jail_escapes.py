"""What the jail's escape tests run (`test_sandbox.py`): the programs tried inside the jail, the trainer processes
that run them (this process as root, and an ordinary user's process on the system Python with a copy of the
sandbox modules), and the host's side (a listening TCP port, a world-connectable UNIX socket, an abstract one, a
SysV shared-memory segment, a data file) they try to reach."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

import rl.core.sandbox as sandbox
from rl.core.sandbox import SandboxLimits

FAST = SandboxLimits(wall_s=8, cpu_s=2, memory_mb=256, processes=16, output_bytes=4096, file_mb=4)
TEST_USER = "rljailtest"

# x86_64 numbers, written out from asm/unistd_64.h: each must answer EPERM in the jail
REFUSED_CALLS = {
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "ptrace": 101, "process_vm_readv": 310,
    "process_vm_writev": 311, "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248, "request_key": 249,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "fsopen": 430, "fsmount": 432, "move_mount": 429,
    "open_tree": 428, "fspick": 433, "fsconfig": 431, "mount_setattr": 442, "settimeofday": 164,
    "clock_settime": 227, "adjtimex": 159, "acct": 163, "syslog": 103, "kcmp": 312, "pidfd_getfd": 438,
}

PROBE = r'''
import ctypes, errno, json, os, socket, struct, sys
host = json.loads(sys.stdin.read())
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
found = {}

def call(nr, *args):
    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if result == -1:
        raise OSError(ctypes.get_errno(), "")
    return result

def attempt(name, action):
    try:
        action()
        found[name] = "ok"
    except OSError as error:
        found[name] = errno.errorcode.get(error.errno, str(error.errno))

def write(path):
    with open(path, "w") as handle:
        handle.write("escaped")

def connect(family, address, kind=socket.SOCK_STREAM):
    with socket.socket(family, kind) as s:
        s.settimeout(3)
        s.connect(address)

def clone_new_user():
    pid = call(56, 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)

def perf_event_open():
    attr = (ctypes.c_char * 128)()
    struct.pack_into("<IIQ", attr, 0, 1, 128, 0)  # PERF_TYPE_SOFTWARE, size, PERF_COUNT_SW_CPU_CLOCK
    struct.pack_into("<Q", attr, 40, 1 | 1 << 5 | 1 << 6)  # disabled, exclude_kernel, exclude_hv
    os.close(call(298, ctypes.addressof(attr), 0, -1, -1, 0))

def shm(key, size, flags):
    libc.shmget.restype = ctypes.c_int
    if libc.shmget(ctypes.c_int(key), ctypes.c_size_t(size), ctypes.c_int(flags)) == -1:
        raise OSError(ctypes.get_errno(), "")

status = {}
with open("/proc/self/status") as lines:
    for line in lines:
        name, _, value = line.partition(":")
        status[name] = value.strip()
found["status"] = {key: status[key] for key in ("Uid", "Gid", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                                "NoNewPrivs", "Seccomp")}
found["root entries"] = sorted(os.listdir("/"))
found["pids"] = sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit())
found["environment"] = sorted(os.environ)
for name, path in (("own environ", "/proc/self/environ"), ("init environ", "/proc/1/environ")):
    try:
        found[name] = open(path, "rb").read().decode(errors="replace")
    except OSError as error:
        found[name] = errno.errorcode.get(error.errno, str(error.errno))

attempt("umount /proc", lambda: call(166, b"/proc", 2))  # MNT_DETACH
attempt("umount /tmp", lambda: call(166, b"/tmp", 2))
attempt("umount /", lambda: call(166, b"/", 2))
attempt("mount tmpfs", lambda: call(165, b"none", b"/tmp/work", b"tmpfs", 0, None))
attempt("sethostname (CAP_SYS_ADMIN)", lambda: socket.sethostname("escaped"))
attempt("raw socket (CAP_NET_RAW)", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("chown a host file", lambda: os.chown(os.path.realpath(sys.executable), 65534, 65534))
attempt("setuid 0", lambda: os.setuid(0))

attempt("read the checkout", lambda: open(host["checkout_file"]).read())
attempt("list the checkout", lambda: os.listdir(host["checkout_dir"]))
attempt("read a data file", lambda: open(host["data_file"]).read())
attempt("read /etc/shadow", lambda: open("/etc/shadow").read())
attempt("read /etc/passwd", lambda: open("/etc/passwd").read())
attempt("list the home directory", lambda: os.listdir(host["home"]))
attempt("read the trainer's environ", lambda: open(f"/proc/{host['trainer_pid']}/environ").read())

attempt("write /run/lock", lambda: write("/run/lock/escaped"))
attempt("write /var/lock", lambda: write("/var/lock/escaped"))
attempt("write the host's folder", lambda: write(host["host_dir"] + "/escaped"))
attempt("write /", lambda: write("/escaped"))
attempt("write the standard library", lambda: write(os.path.dirname(os.__file__) + "/escaped.py"))
attempt("write /dev/shm", lambda: write("/dev/shm/escaped"))
attempt("write /tmp", lambda: write(host["tmp_marker"]))

attempt("tcp to the host's port on loopback", lambda: connect(socket.AF_INET, ("127.0.0.1", host["port"])))
if host["address"]:
    attempt("tcp to the host's address", lambda: connect(socket.AF_INET, (host["address"], host["port"])))
attempt("udp out", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("1.1.1.1", 53)))
attempt("unix socket by path", lambda: connect(socket.AF_UNIX, host["unix_path"]))
attempt("abstract unix socket", lambda: connect(socket.AF_UNIX, b"\0" + host["abstract"].encode()))
attempt("vsock", lambda: socket.socket(40, socket.SOCK_STREAM))
attempt("netlink", lambda: socket.socket(16, socket.SOCK_RAW, 0))
attempt("packet", lambda: socket.socket(17, socket.SOCK_RAW, 0))

attempt("the host's shared memory", lambda: shm(host["host_shm_key"], 0, 0))
attempt("leave shared memory", lambda: shm(host["left_shm_key"], 1 << 20, 0o1000 | 0o666))  # IPC_CREAT

attempt("unshare a user namespace", lambda: call(272, 0x10000000))
attempt("unshare a mount namespace", lambda: call(272, 0x20000))
attempt("clone with CLONE_NEWUSER", clone_new_user)
attempt("clone3", lambda: call(435, 0, 0))
attempt("ptrace(TRACEME)", lambda: call(101, 0, 0, 0, 0))
attempt("keyctl(JOIN_SESSION_KEYRING)", lambda: call(250, 1, 0))
attempt("add_key", lambda: call(248, b"user", b"rl", b"x", 1, -3))
attempt("perf_event_open (own process, user only)", perf_event_open)
attempt("userfaultfd (user mode only)", lambda: os.close(call(323, 1)))
attempt("io_uring_setup", lambda: os.close(call(425, 1, ctypes.addressof((ctypes.c_char * 120)()))))
attempt("fsopen", lambda: call(430, b"tmpfs", 0))
found["table"] = {}
for name, nr in host["refused"].items():
    try:
        call(nr, 0, 0, 0, 0, 0, 0)
        found["table"][name] = "ok"
    except OSError as error:
        found["table"][name] = errno.errorcode.get(error.errno, str(error.errno))
print(json.dumps(found))
'''

FORK_BOMB = r'''
import ctypes, errno, os, sys, time
name = sys.stdin.read().encode()
forks = 0
while True:
    try:
        child = os.fork()
    except OSError as error:
        print(forks, errno.errorcode[error.errno], flush=True)
        break
    if child == 0:
        ctypes.CDLL(None).prctl(15, name)  # PR_SET_NAME: what the host looks for afterwards
        time.sleep(600)
        os._exit(0)
    forks += 1
time.sleep(0.5)
'''

# each child holds 64 MiB (touched), then asks for 160 MiB more: past the 128 MiB of address space it may have
SPREAD_MEMORY = r'''
import errno, mmap, os, time
answers = []
while True:
    read, write = os.pipe()
    try:
        child = os.fork()
    except OSError as error:
        print(len(answers), errno.errorcode[error.errno], sorted(set(answers)))
        break
    if child == 0:
        held = bytearray(64 << 20)
        held[::4096] = b"x" * len(held[::4096])
        try:
            mmap.mmap(-1, 160 << 20)
            answer = b"mapped"
        except OSError as error:
            answer = errno.errorcode[error.errno].encode()
        os.write(write, answer)
        time.sleep(600)  # holding its 64 MiB until the jail ends
    os.close(write)
    answers.append(os.read(read, 32).decode())
    os.close(read)
'''

FILL_SCRATCH = r'''
import errno
written = 0
try:
    for index in range(10_000):
        with open(f"/tmp/fill-{index}", "wb") as handle:
            handle.write(b"x" * (256 << 10))
        written += 256 << 10
except OSError as error:
    print(written, errno.errorcode[error.errno])
'''

I386_GETPID = r'''
import ctypes, mmap
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes([0xB8, 0x14, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20 (i386 getpid); int 0x80; ret
print("i386 getpid answered", ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))())
'''

HOLDER = r'''
import os, time
open("secret.txt", "w").write("s3cret")
time.sleep(3)
print(open("secret.txt").read())
'''

SNOOP = r'''
import glob, os
reached = []
for path in glob.glob("/tmp/**/secret.txt", recursive=True) + glob.glob("/proc/*/root/tmp/work/secret.txt"):
    try:
        with open(path, "r+") as handle:
            reached.append((path, handle.read()))
            handle.seek(0)
            handle.write("tamper")
    except OSError:
        pass
print(reached)
'''

ERRNO_OF = "(g := {{}}, exec({statement!r}, g))[0]['r']"


def errno_of(statement: str) -> str:
    """A Python expression whose value is the errno `statement` fails with (0 when it does not)."""
    body = f"try:\n    {statement}\n    r = 0\nexcept OSError as e:\n    r = e.errno"
    return ERRNO_OF.format(statement=body)


def jobs(host: dict) -> dict[str, dict]:
    """Every run of the suite, by name: code, limits, stdin, a delay before it starts."""
    reward = [("#### " + errno_of(f"open({host['checkout_file']!r}).read()"), str(errno.ENOENT)),
              ("#### " + errno_of(f"open({host['tmp_marker'] + '-reward'!r}, 'w').write('x')"), "0"),
              ("#### " + errno_of("open('/run/lock/escaped', 'w').write('x')"), str(errno.ENOENT)),
              ("#### " + errno_of(f"__import__('socket').create_connection(('127.0.0.1', {host['port']}), 3)"),
               str(errno.ECONNREFUSED))]
    return {
        "probe": {"code": PROBE, "stdin": json.dumps(host)},
        "plain": {"code": "import os\nopen('notes.txt', 'w').write('x')\nprint(os.getcwd(), sorted(os.listdir('.')))"},
        "fork bomb": {"code": FORK_BOMB, "stdin": host["bomb_name"], "limits": {"processes": 8}},
        "spread memory": {"code": SPREAD_MEMORY, "limits": {"processes": 4, "memory_mb": 128}},
        "fill scratch": {"code": FILL_SCRATCH, "limits": {"file_mb": 4}},
        "sleeper": {"code": "import time\ntime.sleep(600)", "limits": {"wall_s": 2}},
        "spinner": {"code": "while True:\n    pass", "limits": {"cpu_s": 1, "wall_s": 60}},
        "flood": {"code": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", "limits": {}},
        "i386": {"code": I386_GETPID},
        "holder": {"code": HOLDER},
        "snoop": {"code": SNOOP, "delay": 1.5},
        "reward": {"reward": reward},
    }


HELPER = r'''
import json, sys, threading, time

def run(job):
    from rl.core.sandbox import SandboxLimits, run_python
    from rl.tasks import code_exec

    time.sleep(job.get("delay", 0))
    if "reward" in job:
        return [code_exec.python_expression_reward(response, answer) for response, answer in job["reward"]]
    result = run_python(job["code"], SandboxLimits(**job["limits"]), job.get("stdin", ""))
    return {name: getattr(result, name) for name in ("status", "returncode", "stdout", "stderr", "wall_s")}

def main(jobs):
    from rl.core.sandbox import SandboxUnavailable

    results = {}
    def one(name):
        try:
            results[name] = run(jobs[name])
        except SandboxUnavailable as error:
            results[name] = {"unavailable": str(error)}
    threads = [threading.Thread(target=one, args=(name,)) for name in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    json.dump(main(json.load(sys.stdin)), sys.stdout)
'''
SHIPPED = ("rl/__init__.py", "rl/core/__init__.py", "rl/core/sandbox.py", "rl/core/sandbox_bwrap.py",
           "rl/core/sandbox_seccomp.py", "rl/core/registry.py", "rl/core/rewards/__init__.py",
           "rl/core/rewards/registry.py", "rl/tasks/__init__.py", "rl/tasks/code_exec.py")


def with_limits(all_jobs: dict) -> dict:
    base = {name: getattr(FAST, name) for name in FAST.__dataclass_fields__}
    return {name: dict(job, limits={**base, **job.get("limits", {})}) for name, job in all_jobs.items()}


def ordinary_user() -> tuple[int, int]:
    """(uid, gid) of an ordinary user: the suite's own, or (as root) the test user, created when missing."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam(TEST_USER)
        return entry.pw_uid, entry.pw_gid
    useradd = shutil.which("useradd", path="/usr/sbin:/sbin:/usr/bin:/bin")
    assert useradd, "the ordinary-user cases need useradd (Debian's passwd package) to create their user"
    subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
                   capture_output=True)  # a concurrent target may have created it meanwhile
    entry = pwd.getpwnam(TEST_USER)
    return entry.pw_uid, entry.pw_gid


def run_as_user(all_jobs: dict, shared: Path, uid: int, gid: int, secret: str) -> dict:
    """The jobs run by a trainer process of uid/gid: the system Python on a copy of the modules it needs (the
    suite's own files may sit in root's home)."""
    source = Path(sandbox.__file__).resolve().parents[2]
    for relative in SHIPPED:
        target = shared / "pkg" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        original = source / relative
        target.write_text(original.read_text() if original.exists() else "")
    (shared / "helper.py").write_text(HELPER)
    for path in [shared, *shared.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    done = subprocess.run(["/usr/bin/python3", "-I", str(shared / "helper.py"), str(shared / "pkg")],
                          input=json.dumps(all_jobs), capture_output=True, text=True, timeout=120, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "RL_JAIL_TEST_SECRET": secret},
                          user=uid, group=gid, extra_groups=[])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def run_here(all_jobs: dict) -> dict:
    helper: dict = {"__name__": "helper"}
    exec(compile(HELPER, "helper", "exec"), helper)
    return helper["main"](all_jobs)


def host_address() -> str | None:
    """This machine's address on its default route (no packet sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


libc = ctypes.CDLL(None, use_errno=True)


def shmget(key: int, size: int, flags: int) -> int:
    found = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(size), ctypes.c_int(flags))
    if found == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return found


def processes_named(name: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{entry}/comm").read_text().strip() == name:
                found.append(int(entry))
    return found


@contextlib.contextmanager
def host_side(token: str, shared: Path):
    """The host's things the jail must not reach, described for the probe; and, on leaving, what reached them."""
    (shared / "data.jsonl").write_text('{"prompt": "secret data"}\n')
    server = socket.create_server(("0.0.0.0", 0))
    # where the world may leave sockets on the host disk (and outside the /tmp the jail replaces), when there is one
    lock = Path("/run/lock")
    unix_path = lock / f"rl-jail-{token}.sock" if os.access(lock, os.W_OK) else shared / "host.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(unix_path))
    os.chmod(unix_path, 0o777)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(b"\0rl-jail-" + token.encode())
    listeners = (server, unix, abstract)
    for listener in listeners:
        listener.listen()
        listener.setblocking(False)
    key = int(token[:7], 16)
    segment = shmget(key, 4096, 0o1000 | 0o666)  # IPC_CREAT
    test_file = Path(__file__).resolve()
    host = {"checkout_file": str(test_file), "checkout_dir": str(test_file.parents[3]),
            "data_file": str(shared / "data.jsonl"), "home": os.path.expanduser("~"), "trainer_pid": os.getpid(),
            "host_dir": str(shared), "tmp_marker": f"/tmp/rl-jail-escaped-{token}", "port": server.getsockname()[1],
            "address": host_address(), "unix_path": str(unix_path), "abstract": f"rl-jail-{token}",
            "host_shm_key": key, "left_shm_key": key + 1, "refused": REFUSED_CALLS, "bomb_name": f"bomb{token[:8]}"}
    seen: dict = {}
    try:
        yield host, seen
    finally:
        seen["accepted"] = []
        for listener in listeners:
            with contextlib.suppress(BlockingIOError):
                seen["accepted"].append(listener.accept())
            listener.close()
        unix_path.unlink(missing_ok=True)
        try:
            shmget(key + 1, 0, 0)
            seen["left shared memory"] = "found"
        except OSError as error:
            seen["left shared memory"] = errno.errorcode[error.errno]
        libc.shmctl(ctypes.c_int(segment), ctypes.c_int(0), None)  # IPC_RMID
        seen["host tmp"] = [os.path.exists(host["tmp_marker"] + suffix) for suffix in ("", "-reward")]
        seen["bomb survivors"] = processes_named(host["bomb_name"])
