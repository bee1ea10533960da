"""A run that loses an actor recovers inside itself (trainer.max_restarts): a generation engine SIGKILLed after step
1's checkpoint and then a training worker after step 2's, the run's actors start again from the last checkpoint each
time, and the run finishes every step with the metrics of every step and the exported weights of a run never
interrupted, bit for bit (resuming is exact on one
thread per process). Past the limit (the default 0) the run ends naming the actor, with a resumable checkpoint:
`test_actor_faults.py`."""

from __future__ import annotations

import os
import re
import signal

import pytest
from safetensors.torch import load_file

from rl.core.subprocess_run import kill_group, start_train
from rl.trainer.state import checkpoint
from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train, wait_for

STEPS = 4  # the second victim dies after step 2, with steps left to recover into
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
    result = run_train(run_dir, _overrides(job, 2), own_ray=True)
    assert result.returncode == 0, result.stderr[-5000:]
    return run_dir


def _last_pid(text: str, pattern: str) -> int:
    return int(re.findall(pattern, text)[-1])


def test_killed_actors_are_recovered_and_the_run_ends_as_if_uninterrupted(job, tmp_path, reference):
    """The engine SIGKILLed after step 1's checkpoint, then, once the run has recovered and checkpointed step 2,
    training worker rank 1 of the new actors: two restarts of two, one run."""
    run_dir, log_path = str(tmp_path / "run"), tmp_path / "launcher.log"
    root = os.path.join(run_dir, "checkpoints")
    log = open(log_path, "w+")  # noqa: SIM115  (read during the run, closed below)
    proc = start_train(run_dir, _overrides(job, 2), output=log)
    try:
        wait_for(proc, lambda: os.path.isdir(checkpoint.step_dir(root, 1)), "the run did not reach step 1", poll_s=0.2)
        engine = _last_pid(log_path.read_text(), VICTIMS["engine"])
        os.kill(engine, signal.SIGKILL)
        wait_for(proc, lambda: "recovered in" in log_path.read_text(), "the run did not recover from the engine",
                 poll_s=0.2)
        wait_for(proc, lambda: os.path.isdir(checkpoint.step_dir(root, 2)), "the run did not reach step 2", poll_s=0.2)
        restarted = log_path.read_text().split("start again from", 1)[1]  # the actors started after the warning
        worker = _last_pid(restarted, VICTIMS["worker"])
        os.kill(worker, signal.SIGKILL)
        code = proc.wait(timeout=300)
        output = log_path.read_text()
    finally:
        kill_group(proc.pid)
        log.close()
    assert code == 0, output[-4000:]
    warnings = [line for line in output.splitlines() if line.startswith("warning: ") and "start again" in line]
    assert len(warnings) == 2, warnings
    named = [rf"generation engine 0 \(\S+ node \S+ pid {engine} \(cpu, CPU cores \[\d+\]\)\)",
             rf"training worker rank 1 \(\S+ node \S+ pid {worker}\)"]
    for warning, victim, restart in zip(warnings, named, (1, 2), strict=True):
        assert re.fullmatch(rf"warning: {victim} died \(.*\) at step \d; the run's actors start again from "
                            rf".*global_step_\d \(restart {restart} of 2\)", warning), warning
        assert re.search(rf"^recovered in \d+\.\d s \(restart {restart} of 2, trainer\.max_restarts\)$", output,
                         re.M), output[-3000:]
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    want = {row["step"]: row for row in read_metrics(os.path.join(reference, "metrics.jsonl"))}
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1)), "each step once, in order"
    for row in rows:
        compared = {key for key in want[row["step"]] if not TIMINGS.search(key)}
        assert {"loss", "grad_norm", "reward_mean", "kl"} <= compared and row.keys() == want[row["step"]].keys()
        assert {key: row[key] for key in compared} == {key: want[row["step"]][key] for key in compared}, row["step"]
    assert rows[-1]["restarts"] == 2 and want[STEPS]["restarts"] == 0
    got, expected = _weights(run_dir), _weights(reference)
    assert got.keys() == expected.keys()
    assert all(got[name].equal(expected[name]) for name in expected), "the exported weights differ"
