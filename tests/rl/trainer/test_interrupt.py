"""Ctrl-C during training (RL and SFT): the launcher ends with exit code 130 and one line naming the step and the last
complete checkpoint (no traceback), and no Ray process of the run outlives it. SIGKILL of the launcher alone: every
process it started is gone within 2 s."""

import json
import os
import re
import signal
import subprocess
import textwrap
import time

import pytest

from rl.core.subprocess_run import kill_group, start_train
from tests.testing.tiny_job import make_tiny_job, wait_for


def _trained_steps(run_dir: str) -> int:
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return sum(1 for line in f if line.strip() and "loss" in json.loads(line))
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def _processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


@pytest.mark.parametrize("whole_group,module", [(True, "rl.launch.train"), (False, "rl.launch.sft")],
                         ids=["terminal", "sft"])
def test_ctrl_c_ends_with_one_line_and_leaves_no_ray_process(tmp_path, whole_group, module):
    """`terminal`: the SIGINT a terminal sends to the whole process group (the reward processes included, which
    ignore it: the driver stops them, as it does when they never got it). `sft`: the supervised launcher (the
    embedded SFT job), the SIGINT sent to the launcher alone (`kill -INT`), says the same."""
    run_dir = str(tmp_path / "run")
    log = open(tmp_path / "launcher.log", "w+")  # noqa: SIM115  (read after the run, closed below)
    if module == "rl.launch.sft":
        overrides = ["trainer.max_steps=200", "trainer.train_batch_size=8", "trainer.policy_mini_batch_size=8",
                     "trainer.ckpt_interval=1", "trainer.eval_interval=0", "trainer.eval_before_train=false"]
    else:
        overrides = [*make_tiny_job(str(tmp_path / "job")).overrides(steps=200), "trainer.ckpt_interval=1"]
    proc = start_train(run_dir, overrides, output=log, module=module)
    try:
        wait_for(proc, lambda: _trained_steps(run_dir) >= 2, "the run did not reach step 2")
        ray_dir = os.path.realpath(os.path.join(run_dir, "ray"))
        if whole_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130
        log.seek(0)
        output = log.read()
        last = output.strip().splitlines()[-1]
        assert re.fullmatch(r"interrupted at step \d+; last complete checkpoint: .*global_step_\d+ \(resume with "
                            r"trainer\.resume_mode=latest\)", last), last
        assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
        time.sleep(3)
        assert not _processes_mentioning(ray_dir), "Ray processes outlived the launcher"
    finally:
        kill_group(proc.pid)
        log.close()


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its new parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` in the process tree, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
            children.setdefault(parent, []).append(int(name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def test_killed_launcher_takes_its_ray_cluster_with_it(tmp_path):
    """SIGKILL to the launcher alone: every process it started (Ray's GCS, raylet and agents, the workers) is gone
    within 2 s. Ray's agents, left to themselves, outlive it by about a minute."""
    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    log = open(tmp_path / "launcher.log", "w+")  # noqa: SIM115  (read during the run, closed below)
    proc = start_train(run_dir, [*job.overrides(steps=200), "trainer.placement.policy_num_gpus_per_node=2"],
                       output=log)
    try:
        wait_for(proc, lambda: _trained_steps(run_dir) >= 1, "the run did not reach step 1")
        log.seek(0)
        # Ray prefixes what an actor prints with its name and pid: this run's workers, whatever else runs here
        workers = {int(pid) for pid in re.findall(r"\(TrainingWorker pid=(\d+)", log.read())}
        assert workers, "no worker output in the launcher log"
        started = _descendants(proc.pid)
        assert workers <= started and len(started) > len(workers), (workers, started)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        gone_by = time.monotonic() + 2
        while any(_alive(pid) for pid in started) and time.monotonic() < gone_by:
            time.sleep(0.1)
        left = _processes(pid for pid in started if _alive(pid))
        assert not left, f"processes outlived the killed launcher by 2 s: {left}"
    finally:
        kill_group(proc.pid)
        log.close()


def _processes(pids) -> list[str]:
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{pid} {args[:120]}")
        except FileNotFoundError:
            pass
    return found


def test_ctrl_c_ends_a_run_whose_agent_is_blocked(tmp_path):
    """An agent that calls the endpoint with a synchronous client, then sleeps synchronously with no deadline
    (environment.agent_timeout_s unset), holds only its own thread: its call is answered, and a terminal's Ctrl-C
    ends the run within seconds, naming the step (before, the synchronous call blocked the event loop that serves
    the calls, and the run ignored SIGINT)."""
    agent = tmp_path / "stuck_agent.py"
    agent.write_text(textwrap.dedent("""
        import time

        import httpx


        async def run(base_url, row, api_key):
            reply = httpx.post(f"{base_url}/chat/completions", json={"messages": row["prompt"]},
                               headers={"Authorization": f"Bearer {api_key}"}, timeout=600)
            reply.raise_for_status()
            print("agent: answered", flush=True)
            time.sleep(600)
            return 0.0
    """))
    run_dir = str(tmp_path / "run")
    log = open(tmp_path / "launcher.log", "w+")  # noqa: SIM115  (read during the run, closed below)
    overrides = [*make_tiny_job(str(tmp_path / "job")).overrides(steps=2), f"environment.agent_fn={agent}:run",
                 "generator.enable_http_endpoint=true", "generator.http_endpoint_port=0",
                 # the episodes play in the rollout queue's thread, which the driver stops on its way out
                 "trainer.placement.colocate_all=false", "trainer.fully_async.enabled=true"]
    proc = start_train(run_dir, overrides, output=log)
    try:
        wait_for(proc, lambda: "agent: answered" in (tmp_path / "launcher.log").read_text(),
                 "no agent's synchronous call was answered")
        time.sleep(2)  # every episode asleep in its agent
        os.killpg(proc.pid, signal.SIGINT)
        interrupted = time.monotonic()
        assert proc.wait(timeout=60) == 130
        assert time.monotonic() - interrupted < 20
        log.seek(0)
        last = log.read().strip().splitlines()[-1]
        assert last == "interrupted at step 1; no complete checkpoint yet", last  # the first step never ends
    finally:
        kill_group(proc.pid)
        log.close()
