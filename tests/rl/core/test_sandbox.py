"""The sandbox for model-written code: each escape attempt is contained and reported, nothing outside the scratch
directory changes, and the next run goes on as usual."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import pytest

from rl.core.sandbox import NOBODY, SandboxLimits, SandboxUnavailable, run_python, sandbox_problem

PROBLEM = sandbox_problem()
needs_sandbox = pytest.mark.skipif(PROBLEM is not None, reason=f"no sandbox here: {PROBLEM}")
FAST = SandboxLimits(wall_s=8, cpu_s=2, memory_mb=256, processes=16, output_bytes=4096, file_mb=4)


def sandbox_uid() -> int:
    return NOBODY if os.geteuid() == 0 else os.geteuid()


def processes_of(uid: int) -> int:
    count = 0
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            count += os.stat(f"/proc/{entry}").st_uid == uid
    return count


def still_works() -> None:
    result = run_python("print(6 * 7)", FAST)
    assert (result.status, result.stdout) == ("ok", "42\n"), result


@needs_sandbox
def test_a_plain_run_prints_and_keeps_its_files_to_itself():
    result = run_python("import os\nopen('notes.txt', 'w').write('x')\nprint(os.getcwd(), sorted(os.listdir('.')))",
                        FAST)
    assert (result.status, result.stdout) == ("ok", "/tmp/work ['main.py', 'notes.txt']\n"), result


@needs_sandbox
def test_no_network():
    result = run_python("import socket\ns = socket.socket()\ns.settimeout(3)\ns.connect(('1.1.1.1', 53))", FAST)
    assert result.status == "error" and "Network is unreachable" in result.stderr, result
    still_works()


@needs_sandbox
def test_no_writes_outside_the_scratch_directory(tmp_path):
    home = os.path.expanduser("~")
    targets = ["/etc/rl_sandbox_escape", f"{home}/rl_sandbox_escape", str(tmp_path / "escape"), "/tmp/rl_escape"]
    code = f"import sys\nfor path in {targets!r}:\n" + (
        "    try:\n        open(path, 'w').write('x')\n        print('wrote', path)\n"
        "    except OSError as error:\n        print('refused', path, type(error).__name__)\n")
    result = run_python(code, FAST)
    assert result.status == "ok", result
    # /tmp inside is a private tmpfs: the write "succeeds" there and vanishes with the run
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["refused", "refused", "refused", "wrote"]
    assert not any(os.path.exists(path) for path in targets)
    still_works()


@needs_sandbox
def test_a_fork_bomb_is_capped_and_cleaned_up():
    before = processes_of(sandbox_uid())
    started = time.monotonic()
    result = run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
                        FAST)
    assert result.status in ("timeout", "killed"), result
    assert time.monotonic() - started < FAST.wall_s + 5
    deadline = time.monotonic() + 10
    while processes_of(sandbox_uid()) > before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(sandbox_uid()) <= before
    still_works()


@needs_sandbox
def test_memory_cpu_wall_and_output_limits():
    big = run_python("b = bytearray(10 * 2**30)", FAST)
    assert big.status == "error" and "MemoryError" in big.stderr, big
    # the CPU limit, long before the wall clock (generous: a loaded machine gives a run a small share of a core)
    spin = run_python("while True:\n    pass", SandboxLimits(cpu_s=1, wall_s=120))
    assert spin.status == "killed" and spin.returncode in (128 + 9, 128 + 24) and spin.wall_s < 120, spin
    sleeper = run_python("import time\ntime.sleep(600)", SandboxLimits(wall_s=2))
    assert sleeper.status == "timeout" and sleeper.wall_s < 5, sleeper
    loud = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", FAST)
    assert loud.status == "output_limit" and loud.output_truncated and len(loud.stdout) == FAST.output_bytes, loud
    still_works()


@needs_sandbox
def test_a_run_cannot_read_another_runs_files():
    first: dict = {}
    writer = threading.Thread(target=lambda: first.update(result=run_python(
        "import os, time\nopen('secret.txt', 'w').write('s3cret')\nprint(os.path.realpath('secret.txt'))\n"
        "time.sleep(3)", FAST)))
    writer.start()
    time.sleep(1.5)
    snoop = run_python("import glob, os\nprint(glob.glob('/tmp/**/secret.txt', recursive=True), os.listdir('/tmp'))"
                       "\nprint(sorted(os.listdir('/proc'))[:3])", FAST)
    writer.join()
    assert first["result"].status == "ok"
    assert snoop.stdout.splitlines()[0] == "[] ['work']", snoop
    assert "s3cret" not in snoop.stdout
    still_works()


def test_without_namespaces_the_sandbox_refuses(monkeypatch):
    import rl.core.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_CHECKED", ["user namespaces are not available here"])
    with pytest.raises(SandboxUnavailable, match="user namespaces are not available here"):
        run_python("print(1)")


@needs_sandbox
def test_the_python_expression_reward_runs_answers_in_the_sandbox():
    from rl.core.rewards import REWARD_FUNCTIONS
    from rl.tasks import rewards  # noqa: F401  (registers python_expression)

    reward = REWARD_FUNCTIONS.get("python_expression")
    assert reward("The list is #### sorted([3, 1, 2])", "[1, 2, 3]") == {"score": 1.0, "sandbox_ok": 1.0}
    assert reward("```python\nsum(range(4))\n```", "6")["score"] == 1.0
    assert reward("#### 2 + 2", "5")["score"] == 0.0
    escape = reward("#### __import__('os').system('touch /etc/rl_reward_escape') or 1", "1")
    assert not os.path.exists("/etc/rl_reward_escape") and escape["sandbox_ok"] == 1.0
    assert reward("#### [0] * 10**10", "0") == {"score": 0.0, "sandbox_ok": 0.0}  # MemoryError, contained
