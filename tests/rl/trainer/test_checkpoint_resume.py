"""A run SIGKILLed in the middle of a checkpoint write resumes from the last complete one and then produces the
same metrics as a run that was never interrupted; the half-written checkpoint is never loaded."""

import os
import signal

import pytest

from rl.trainer import checkpoint
from rl.trainer.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

STEPS = 3
COMPARED = ("reward_mean", "loss", "pg_loss", "grad_norm", "kl", "entropy")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _overrides(job):
    return [*job.overrides(steps=STEPS), "trainer.ckpt_interval=1", "data.reward_fn=gsm8k_flexible",
            "trainer.algorithm.use_entropy_loss=true"]


def test_killed_during_checkpoint_resumes_like_an_uninterrupted_run(job, tmp_path):
    reference_dir, crashed_dir = str(tmp_path / "reference"), str(tmp_path / "crashed")
    reference = run_train(reference_dir, _overrides(job))
    assert reference.returncode == 0, reference.stderr[-5000:]

    crashed = run_train(crashed_dir, _overrides(job),
                        env_extra={"RL_KILL_AT": "checkpoint_written:2"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    root = os.path.join(crashed_dir, "checkpoints")
    assert os.path.isdir(os.path.join(root, "global_step_2.partial")), os.listdir(root)
    assert checkpoint.latest(root) == os.path.join(root, "global_step_1")

    resumed = run_train(crashed_dir, [*_overrides(job), "trainer.resume_mode=latest"])
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    assert "resumed from" in resumed.stdout and "global_step_1 (step 1)" in resumed.stdout

    expected = {row["step"]: row for row in read_metrics(os.path.join(reference_dir, "metrics.jsonl"))}
    got = {row["step"]: row for row in read_metrics(os.path.join(crashed_dir, "metrics.jsonl"))}
    assert sorted(got) == sorted(expected) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        for key in COMPARED:
            assert got[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)
    assert checkpoint.latest(root) == os.path.join(root, f"global_step_{STEPS}")


def test_fresh_run_refuses_a_used_run_dir(job, tmp_path):
    run_dir = str(tmp_path / "used")
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        f.write('{"step": 1}\n')
    result = run_train(run_dir, job.overrides(steps=1))
    assert result.returncode != 0
    assert "already holds a run" in result.stderr and "resume_mode=latest" in result.stderr
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        assert f.read() == '{"step": 1}\n'
