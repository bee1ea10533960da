"""Ctrl-C during training: the launcher ends with exit code 130 and one line naming the step and the last complete
checkpoint (no traceback), and no Ray process of the run outlives it."""

import json
import os
import re
import signal
import subprocess
import time

from rl.launch.subprocess_run import kill_group, start_train
from tests.testing.tiny_job import make_tiny_job


def _trained_steps(run_dir: str) -> int:
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return sum(1 for line in f if line.strip() and "loss" in json.loads(line))
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def _processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


def test_ctrl_c_ends_with_one_line_and_leaves_no_ray_process(tmp_path):
    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    log = open(tmp_path / "launcher.log", "w+")  # noqa: SIM115  (read after the run, closed below)
    proc = start_train(run_dir, [*job.overrides(steps=200), "trainer.ckpt_interval=1"], output=log)
    try:
        deadline = time.monotonic() + 300
        while _trained_steps(run_dir) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not reach step 2"
            time.sleep(0.5)
        ray_dir = os.path.realpath(os.path.join(run_dir, "ray"))
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130
        log.seek(0)
        output = log.read()
        last = output.strip().splitlines()[-1]
        assert re.fullmatch(r"interrupted at step \d+; last complete checkpoint: .*global_step_\d+ \(resume with "
                            r"trainer\.resume_mode=latest\)", last), last
        assert "Traceback" not in output
        time.sleep(3)
        assert not _processes_mentioning(ray_dir), "Ray processes outlived the launcher"
    finally:
        kill_group(proc.pid)
        log.close()
