"""The jail's seccomp filter: a classic-BPF program (the form bubblewrap's `--seccomp FD` loads) that refuses the
system calls model-written code has no use for and that widen what a process can reach: mounts, namespaces,
ptrace and cross-process memory, the kernel keyring, `bpf`, `perf_event_open`, `userfaultfd`, io_uring, kernel
modules, kexec, swap, reboot, clocks and raw port I/O.

Only x86_64 has a table here (`filter_problem()` says why elsewhere). The program:

- kills the process (SIGSYS) for a call made under another ABI than x86_64's (e.g. i386 through `int 0x80`, whose
  numbers differ and would pass a table written for x86_64), and answers ENOSYS to x32 numbers;
- answers ENOSYS to `clone3` (its flags sit in memory a filter cannot read; libc then falls back to `clone`) and
  EPERM to `clone` with any CLONE_NEW* flag;
- answers EAFNOSUPPORT to `socket` / `socketpair` of any family but AF_UNIX, AF_INET and AF_INET6 (AF_VSOCK, for
  one, reaches a virtual machine's host from any network namespace);
- answers EPERM to every call in `REFUSED`, and allows the rest.
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# x86_64 numbers (asm/unistd_64.h)
REFUSED = {
    "ptrace": 101, "syslog": 103, "uselib": 134, "pivot_root": 155, "_sysctl": 156, "chroot": 161, "acct": 163,
    "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
    "iopl": 172, "ioperm": 173, "create_module": 174, "init_module": 175, "delete_module": 176, "quotactl": 179,
    "nfsservctl": 180, "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246, "add_key": 248,
    "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298, "fanotify_init": 300,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308,
    "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320,
    "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443, "adjtimex": 159, "vhangup": 153,
}
CLONE, CLONE3, SOCKET, SOCKETPAIR = 56, 435, 41, 53
# CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NAMESPACES = 0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
SOCKET_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_KILL_PROCESS, _ALLOW, _ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low word: little-endian)


def filter_problem() -> str | None:
    """Why this machine gets no filter, or None."""
    machine = platform.machine()
    if machine != "x86_64" or struct.calcsize("P") != 8:
        return f"the jail's seccomp filter is written for x86_64 only; this machine is {machine}"
    return None


def _op(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return code, jt, jf, k


def _errno(number: int) -> tuple[int, int, int, int]:
    return _op(_RET, _ERRNO | number)


def _argument_check(nr: int, allowed: tuple[int, ...] | None, refused_bits: int, answer: int) -> list[tuple]:
    """If the call is `nr`: its first argument's low word must be one of `allowed` (or have none of
    `refused_bits`), else `answer`; either way the decision is made here. Any other call skips the block with its
    number still loaded."""
    if allowed is not None:
        tests = [_op(_JEQ, value, jt=len(allowed) - index, jf=0) for index, value in enumerate(allowed)]
    else:
        tests = [_op(_JSET, refused_bits, jt=0, jf=1)]
    body = [_op(_LD_W_ABS, _ARG0), *tests, _errno(answer), _op(_RET, _ALLOW)]
    return [_op(_JEQ, nr, jt=0, jf=len(body)), *body]


def program(without: frozenset[str] = frozenset()) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions. `without` leaves named calls out of the refused table (for
    tests that show a check is what refuses a call)."""
    refused = [nr for name, nr in sorted(REFUSED.items()) if name not in without]
    head = [
        _op(_LD_W_ABS, _ARCH),
        _op(_JEQ, AUDIT_ARCH_X86_64, jt=1, jf=0),
        _op(_RET, _KILL_PROCESS),
        _op(_LD_W_ABS, _NR),
        _op(_JGE, X32_SYSCALL_BIT, jt=0, jf=1),
        _errno(errno.ENOSYS),
        _op(_JEQ, CLONE3, jt=0, jf=1),
        _errno(errno.ENOSYS),
    ]
    checks = []
    for nr, allowed, bits, answer in ((CLONE, None, CLONE_NAMESPACES, errno.EPERM),
                                      (SOCKET, SOCKET_FAMILIES, 0, errno.EAFNOSUPPORT),
                                      (SOCKETPAIR, SOCKET_FAMILIES, 0, errno.EAFNOSUPPORT)):
        checks += _argument_check(nr, allowed, bits, answer)
    # each test jumps past the tests after it and the ALLOW to the shared EPERM
    table = [_op(_JEQ, nr, jt=len(refused) - index, jf=0) for index, nr in enumerate(refused)]
    return [*head, *checks, *table, _op(_RET, _ALLOW), _errno(errno.EPERM)]


def compiled(without: frozenset[str] = frozenset()) -> bytes:
    """The program as the kernel's `struct sock_filter` array, which bubblewrap reads from `--seccomp FD`."""
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in program(without))
