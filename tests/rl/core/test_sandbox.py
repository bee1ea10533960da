"""The jail for model-written code (`rl.core.sandbox`): every escape is refused with the errno or signal of the layer
that refuses it, whether the trainer runs as root or as an ordinary user (a user this test creates, whose trainer
process runs the system Python on a copy of the sandbox modules). What the jail's code tries comes from one probe
program in one jail per trainer; the limits each take a jail of their own; all of them run side by side, once.

Planted weaknesses (each planted in the jail's command line, `rl/core/sandbox_bwrap.py`, and seen to make exactly
these fail, as root and as the ordinary user):
- the seccomp filter left out (no `--seccomp`): test_the_jail_is_unprivileged (Seccomp 0),
  test_the_seccomp_filter_refuses (ptrace, keyctl, add_key, perf_event_open, userfaultfd, io_uring and AF_VSOCK
  succeed; unshare of a user namespace answers ENOSPC, clone3 EINVAL), test_an_i386_system_call_kills_the_run
  (the i386 getpid answers);
- the read-only root replaced by a writable bind of the host's (`--bind / /`, no `--remount-ro /`):
  test_mounts_and_capabilities_are_refused (chown answers EPERM, not EROFS), test_host_files_are_out_of_view,
  test_nothing_outside_scratch_can_be_written (/run/lock and /var/lock written), test_no_network_and_no_host_socket
  (the UNIX socket in /run/lock accepts), test_the_python_expression_reward_cannot_escape,
  test_with_the_opt_out_and_no_filter_the_jail_runs_without_it (the host's root listed);
- no pid namespace (no `--unshare-pid`, the host's /proc bound for the jail's own):
  test_the_trainers_environment_is_out_of_reach (the host's processes in view),
  test_a_fork_bomb_is_capped_and_cleaned_up and test_memory_spread_over_processes_is_bounded (the children outlive
  the run).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

import rl.core.sandbox as sandbox
from rl.core.sandbox import Isolation, SandboxUnavailable, run_python, sandbox_problem
from tests.rl.core.jail_escapes import (
    FAST,
    REFUSED_CALLS,
    host_side,
    jobs,
    ordinary_user,
    run_as_user,
    run_here,
    with_limits,
)

PROBLEM = sandbox_problem()
needs_jail = pytest.mark.skipif(PROBLEM is not None, reason=f"no jail on this machine: {PROBLEM}")
SIGSYS, SIGXCPU, SIGKILL = 31, 24, 9


def _keep(results: dict, name: str, job) -> None:
    try:
        results[name] = job()
    except BaseException as error:  # raised again by the tests that read it
        results[name] = error


@pytest.fixture(scope="module")
def runs():
    """{"root" | "user": {job: result}} and what the host saw: every job of both trainers, run side by side once."""
    if PROBLEM is not None:
        pytest.skip(f"no jail on this machine: {PROBLEM}")
    token = secrets.token_hex(6)
    shared = Path(tempfile.mkdtemp(prefix="rl-jail-test-", dir="/tmp"))
    shared.chmod(0o755)  # the ordinary user's trainer reads its copy of the modules here
    results: dict = {"token": token}
    os.environ["RL_JAIL_TEST_SECRET"] = token  # in the trainer's environment, for the jail to look for
    try:
        with host_side(token, shared) as (host, seen):
            all_jobs = with_limits(jobs(host))
            uid, gid = ordinary_user()
            started = time.monotonic()
            work = {"user": lambda: run_as_user(all_jobs, shared, uid, gid, token)} if os.geteuid() == 0 else {}
            work["root" if os.geteuid() == 0 else "user"] = lambda: run_here(all_jobs)
            threads = [threading.Thread(target=_keep, args=(results, name, job)) for name, job in work.items()]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            results["wall_s"] = time.monotonic() - started
        results.update(seen)
        yield results
    finally:
        os.environ.pop("RL_JAIL_TEST_SECRET", None)
        shutil.rmtree(shared, ignore_errors=True)


TRAINERS = ["root", "user"]


def of(runs: dict, trainer: str, job: str):
    if trainer not in runs:
        pytest.skip(f"the suite runs as uid {os.geteuid()}: the {trainer} trainer needs root to be tried")
    if isinstance(runs[trainer], BaseException):
        raise runs[trainer]
    result = runs[trainer][job]
    if isinstance(result, dict) and "unavailable" in result:
        pytest.skip(f"the {trainer} trainer gets no jail here: {result['unavailable']}")
    return result


def probe(runs: dict, trainer: str) -> dict:
    result = of(runs, trainer, "probe")
    assert result["status"] == "ok", result
    return json.loads(result["stdout"])


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_plain_run_prints_and_keeps_its_files_to_itself(runs, trainer):
    result = of(runs, trainer, "plain")
    assert (result["status"], result["stdout"]) == ("ok", "/tmp/work ['main.py', 'notes.txt']\n"), result


@pytest.mark.parametrize("trainer", TRAINERS)
def test_the_jail_is_unprivileged(runs, trainer):
    """An unmapped user (65534 inside), no capability in any set, no_new_privs, a seccomp filter."""
    status = probe(runs, trainer)["status"]
    assert status == {"Uid": "65534\t65534\t65534\t65534", "Gid": "65534\t65534\t65534\t65534",
                      "CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapBnd": "0" * 16,
                      "CapAmb": "0" * 16, "NoNewPrivs": "1", "Seccomp": "2"}


@pytest.mark.parametrize("trainer", TRAINERS)
def test_mounts_and_capabilities_are_refused(runs, trainer):
    found = probe(runs, trainer)
    assert {name: found[name] for name in ("umount /proc", "umount /tmp", "umount /", "mount tmpfs")} == dict.fromkeys(
        ("umount /proc", "umount /tmp", "umount /", "mount tmpfs"), "EPERM")
    assert found["sethostname (CAP_SYS_ADMIN)"] == "EPERM"
    assert found["raw socket (CAP_NET_RAW)"] == "EPERM"
    assert found["chown a host file"] == "EROFS"  # bound read-only, and without CAP_CHOWN besides
    assert found["setuid 0"] == "EINVAL"  # root is not mapped in the jail's user namespace


@pytest.mark.parametrize("trainer", TRAINERS)
def test_the_seccomp_filter_refuses(runs, trainer):
    """What an unprivileged process may do elsewhere (a user namespace, ptrace of itself, a keyring, a perf event,
    a userfaultfd, an io_uring, a vsock) is refused by the filter, each with its errno; every call of the table
    answers EPERM."""
    found = probe(runs, trainer)
    expected = {"unshare a user namespace": "EPERM", "unshare a mount namespace": "EPERM",
                "clone with CLONE_NEWUSER": "EPERM", "clone3": "ENOSYS", "ptrace(TRACEME)": "EPERM",
                "keyctl(JOIN_SESSION_KEYRING)": "EPERM", "add_key": "EPERM",
                "perf_event_open (own process, user only)": "EPERM", "userfaultfd (user mode only)": "EPERM",
                "io_uring_setup": "EPERM", "fsopen": "EPERM", "vsock": "EAFNOSUPPORT", "netlink": "EAFNOSUPPORT",
                "packet": "EAFNOSUPPORT"}
    assert {name: found[name] for name in expected} == expected
    assert found["table"] == dict.fromkeys(REFUSED_CALLS, "EPERM")


@pytest.mark.parametrize("trainer", TRAINERS)
def test_an_i386_system_call_kills_the_run(runs, trainer):
    """A call through the i386 ABI (`int 0x80`, numbers a table for x86_64 does not cover) is killed with SIGSYS."""
    result = of(runs, trainer, "i386")
    assert (result["status"], result["returncode"], result["stdout"]) == ("killed", 128 + SIGSYS, ""), result


@pytest.mark.parametrize("trainer", TRAINERS)
def test_host_files_are_out_of_view(runs, trainer):
    found = probe(runs, trainer)
    # the interpreter's files (/usr, and /lib, /lib64 as links or binds), /proc, /dev and the scratch: no /etc,
    # /home, /root, /run, /var, no checkout
    assert {"dev", "proc", "tmp", "usr"} <= set(found["root entries"]) <= {"dev", "proc", "tmp", "usr", "lib",
                                                                           "lib64", "lib32", "bin"}
    for name in ("read the checkout", "list the checkout", "read a data file", "read /etc/shadow",
                 "read /etc/passwd", "list the home directory"):
        assert found[name] == "ENOENT", (name, found[name])


@pytest.mark.parametrize("trainer", TRAINERS)
def test_the_trainers_environment_is_out_of_reach(runs, trainer):
    """The jail's environment is PATH, HOME, LANG (and Python's flag); its pid 1 is the jail's own init, started
    with PATH alone; the trainer's process is not in its pid namespace."""
    found = probe(runs, trainer)
    assert found["environment"] == ["HOME", "LANG", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE"]
    assert found["pids"] == [1, 2]
    assert found["init environ"] == "PATH=/usr/bin:/bin\0"
    assert runs["token"] not in found["own environ"] + found["init environ"]
    assert found["read the trainer's environ"] == "ENOENT"


@pytest.mark.parametrize("trainer", TRAINERS)
def test_nothing_outside_scratch_can_be_written(runs, trainer):
    found = probe(runs, trainer)
    assert found["write /run/lock"] == found["write /var/lock"] == found["write the host's folder"] == "ENOENT"
    assert found["write /"] == found["write the standard library"] == found["write /dev/shm"] == "EROFS"
    assert found["write /tmp"] == "ok"  # the jail's own /tmp: its scratch, gone with it
    assert runs["host tmp"] == [False, False]


@pytest.mark.parametrize("trainer", TRAINERS)
def test_no_network_and_no_host_socket(runs, trainer):
    found = probe(runs, trainer)
    assert found["tcp to the host's port on loopback"] == "ECONNREFUSED"  # the jail's own loopback: nobody there
    assert found.get("tcp to the host's address", "ENETUNREACH") == "ENETUNREACH"
    assert found["udp out"] == "ENETUNREACH"
    assert found["unix socket by path"] == "ENOENT"
    assert found["abstract unix socket"] == "ECONNREFUSED"  # abstract names belong to the network namespace
    assert runs["accepted"] == []


@pytest.mark.parametrize("trainer", TRAINERS)
def test_sysv_shared_memory_is_the_jails_own(runs, trainer):
    found = probe(runs, trainer)
    assert found["the host's shared memory"] == "ENOENT"
    assert found["leave shared memory"] == "ok"
    assert runs["left shared memory"] == "ENOENT"  # gone with the jail's IPC namespace


@pytest.mark.parametrize("trainer", TRAINERS)
def test_another_runs_scratch_is_out_of_reach(runs, trainer):
    """A run looking for another run's file while that run holds it (in /tmp, and through /proc/*/root) finds
    nothing; the holder reads its file back unchanged."""
    holder, snoop = of(runs, trainer, "holder"), of(runs, trainer, "snoop")
    assert (snoop["status"], snoop["stdout"]) == ("ok", "[]\n"), snoop
    assert (holder["status"], holder["stdout"]) == ("ok", "s3cret\n"), holder


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_fork_bomb_is_capped_and_cleaned_up(runs, trainer):
    """8 processes: the first and 7 forks; the 8th fork fails with EAGAIN; when the run ends every process of the
    jail is gone (its pid namespace dies with its init)."""
    result = of(runs, trainer, "fork bomb")
    assert (result["status"], result["stdout"]) == ("ok", "7 EAGAIN\n"), result
    assert result["wall_s"] < 5, result
    assert runs["bomb survivors"] == []


@pytest.mark.parametrize("trainer", TRAINERS)
def test_memory_spread_over_processes_is_bounded(runs, trainer):
    """4 processes of 128 MiB of address space each: 3 children hold 64 MiB each, each one's further 160 MiB is
    refused (ENOMEM), and a 4th child cannot start (EAGAIN): at most 4 x 128 MiB in all."""
    result = of(runs, trainer, "spread memory")
    assert (result["status"], result["stdout"]) == ("ok", "3 EAGAIN ['ENOMEM']\n"), result


@pytest.mark.parametrize("trainer", TRAINERS)
def test_scratch_is_capped_in_total(runs, trainer):
    """4 MiB of scratch in all: 256 KiB files until the tmpfs is full (ENOSPC), less than 4 MiB written."""
    result = of(runs, trainer, "fill scratch")
    written, reason = result["stdout"].split()
    assert result["status"] == "ok" and reason == "ENOSPC" and 3 << 20 <= int(written) < 4 << 20, result


@pytest.mark.parametrize("trainer", TRAINERS)
def test_wall_clock_cpu_and_output_limits(runs, trainer):
    sleeper = of(runs, trainer, "sleeper")
    assert (sleeper["status"], sleeper["returncode"]) == ("timeout", -SIGKILL) and sleeper["wall_s"] < 4, sleeper
    # the CPU limit, long before the wall clock (generous: a loaded machine gives a run a small share of a core)
    spinner = of(runs, trainer, "spinner")
    assert spinner["status"] == "killed" and spinner["returncode"] in (128 + SIGKILL, 128 + SIGXCPU), spinner
    assert spinner["wall_s"] < 60, spinner
    flood = of(runs, trainer, "flood")
    assert flood["status"] == "output_limit" and len(flood["stdout"]) == FAST.output_bytes, flood


@pytest.mark.parametrize("trainer", TRAINERS)
def test_the_python_expression_reward_cannot_escape(runs, trainer):
    """Through `data.reward_fn=python_expression`'s function (what the reward processes call): the answer's errno
    is the jail's (the checkout not there, /run/lock not there, the host's port refused), and a write to /tmp lands
    in the jail's scratch, not on the host."""
    scores = of(runs, trainer, "reward")
    assert scores == [{"score": 1.0, "sandbox_ok": 1.0}] * 4
    assert runs["host tmp"] == [False, False]


@needs_jail
def test_the_python_expression_reward_scores_in_the_jail():
    from rl.core.rewards import REWARD_FUNCTIONS
    from rl.tasks import rewards  # noqa: F401  (registers python_expression)

    reward = REWARD_FUNCTIONS.get("python_expression")
    assert getattr(reward, "runs_model_code", False)
    assert reward("The list is #### sorted([3, 1, 2])", "[1, 2, 3]") == {"score": 1.0, "sandbox_ok": 1.0}
    assert reward("```python\nsum(range(4))\n```", "6")["score"] == 1.0
    assert reward("#### 2 + 2", "5")["score"] == 0.0
    assert reward("#### [0] * 10**10", "0") == {"score": 0.0, "sandbox_ok": 0.0}  # MemoryError, contained


def test_where_the_jail_cannot_be_built_runs_are_refused_naming_the_key(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: Isolation(jail="user namespaces are not available here"))
    monkeypatch.delenv(sandbox.WEAKER_ISOLATION_VARIABLE, raising=False)
    with pytest.raises(SandboxUnavailable, match=re.escape(
            "user namespaces are not available here. With environment.sandbox.allow_weaker_isolation=true "
            "model-written code runs unconfined")):
        run_python("print(1)")


def test_with_the_opt_out_and_no_jail_the_code_runs_unconfined_with_its_limits(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: Isolation(jail="user namespaces are not available here"))
    monkeypatch.setenv(sandbox.WEAKER_ISOLATION_VARIABLE, "1")
    result = run_python("import os\nprint(os.getcwd().startswith('/tmp/rl-sandbox-'), sorted(os.environ))\n"
                        "bytearray(512 << 20)", FAST)
    assert result.status == "error" and "MemoryError" in result.stderr, result
    assert result.stdout == "True ['HOME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE']\n", result


@needs_jail
def test_with_the_opt_out_and_no_filter_the_jail_runs_without_it(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: Isolation(seccomp="no filter for this CPU"))
    monkeypatch.setenv(sandbox.WEAKER_ISOLATION_VARIABLE, "1")
    result = run_python("print([l.split()[1] for l in open('/proc/self/status') if l.startswith('Seccomp:')])\n"
                        "import os\nprint(sorted(os.listdir('/')))", FAST)
    assert result.stdout.splitlines() == ["['0']", "['dev', 'lib', 'lib64', 'proc', 'tmp', 'usr']"], result
    monkeypatch.delenv(sandbox.WEAKER_ISOLATION_VARIABLE)
    with pytest.raises(SandboxUnavailable, match=re.escape(
            "no filter for this CPU. With environment.sandbox.allow_weaker_isolation=true model-written code runs "
            "in the jail without its seccomp filter")):
        run_python("print(1)")
