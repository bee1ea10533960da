"""A run that loses an actor recovers inside itself (trainer.max_restarts): a generation engine or a training worker
SIGKILLed after step 1's checkpoint, the run's actors start again from it, and the run finishes every step with the
metrics of every step and the exported weights of a run never interrupted, bit for bit (resuming is exact on one
thread per process). Past the limit (the default 0) the run ends naming the actor, with a resumable checkpoint:
`test_actor_faults.py`."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from safetensors.torch import load_file

from rl.core.subprocess_run import kill_group, start_train
from rl.trainer.state import checkpoint
from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

STEPS = 3
RUN = ["trainer.placement.colocate_all=false", "trainer.placement.policy_num_gpus_per_node=2",
       "trainer.micro_train_batch_size_per_gpu=1", "trainer.micro_forward_batch_size_per_gpu=1",
       "trainer.ckpt_interval=1", f"trainer.hf_save_interval={STEPS}", "trainer.actor_call_timeout_s=60"]
TIMINGS = re.compile(r"_time_s$|^tokens_per_s$|^restarts$")  # the only entries a recovery may change
VICTIMS = {"engine": r"engine 0: \S+ node \S+ pid (\d+)", "worker": r"rank 1: \S+ node \S+ pid (\d+)"}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _overrides(job, restarts: int) -> list[str]:
    return [*job.overrides(steps=STEPS), *RUN, f"trainer.max_restarts={restarts}"]


def _weights(run_dir: str) -> dict:
    export = os.path.join(run_dir, "exports", f"global_step_{STEPS}")
    return {name: tensor for file in sorted(os.listdir(export)) if file.endswith(".safetensors")
            for name, tensor in load_file(os.path.join(export, file)).items()}


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory) -> str:
    run_dir = str(tmp_path_factory.mktemp("reference"))
    result = run_train(run_dir, _overrides(job, 1), own_ray=True)
    assert result.returncode == 0, result.stderr[-5000:]
    return run_dir


def _kill_after_step_1(job, run_dir: str, log_path, pattern: str, restarts: int) -> tuple[int, str]:
    log = open(log_path, "w+")  # noqa: SIM115  (read during the run, closed below)
    proc = start_train(run_dir, _overrides(job, restarts), output=log)
    try:
        deadline = time.monotonic() + 300
        while not os.path.isdir(checkpoint.step_dir(os.path.join(run_dir, "checkpoints"), 1)):
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not reach step 1"
            time.sleep(0.2)
        log.seek(0)
        pid = int(re.search(pattern, log.read()).group(1))
        os.kill(pid, signal.SIGKILL)
        code = proc.wait(timeout=300)
        log.seek(0)
        return code, log.read()
    finally:
        kill_group(proc.pid)
        log.close()


@pytest.mark.parametrize("victim", VICTIMS)
def test_a_killed_actor_is_recovered_and_the_run_ends_as_if_uninterrupted(job, tmp_path, reference, victim):
    run_dir = str(tmp_path / "run")
    code, output = _kill_after_step_1(job, run_dir, tmp_path / "launcher.log", VICTIMS[victim], restarts=1)
    assert code == 0, output[-4000:]
    [warning] = [line for line in output.splitlines() if line.startswith("warning: ") and "start again" in line]
    assert re.fullmatch(r"warning: .* died \(.*\) at step \d; the run's actors start again from "
                        r".*global_step_\d \(restart 1 of 1\)", warning), warning
    recovered = re.search(r"^recovered in \d+\.\d s \(restart 1 of 1, trainer\.max_restarts\)$", output, re.M)
    assert recovered, output[-3000:]
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    want = {row["step"]: row for row in read_metrics(os.path.join(reference, "metrics.jsonl"))}
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1)), "each step once, in order"
    for row in rows:
        compared = {key for key in want[row["step"]] if not TIMINGS.search(key)}
        assert {"loss", "grad_norm", "reward_mean", "kl"} <= compared and row.keys() == want[row["step"]].keys()
        assert {key: row[key] for key in compared} == {key: want[row["step"]][key] for key in compared}, row["step"]
    assert rows[-1]["restarts"] == 1 and want[STEPS]["restarts"] == 0
    got, expected = _weights(run_dir), _weights(reference)
    assert got.keys() == expected.keys()
    assert all(got[name].equal(expected[name]) for name in expected), "the exported weights differ"
