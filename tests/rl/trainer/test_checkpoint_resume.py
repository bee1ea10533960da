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


@pytest.fixture(scope="module")
def expected(job, tmp_path_factory) -> dict[int, dict]:
    """Per-step metrics of the run that was never interrupted."""
    reference_dir = str(tmp_path_factory.mktemp("reference"))
    reference = run_train(reference_dir, _overrides(job))
    assert reference.returncode == 0, reference.stderr[-5000:]
    return {row["step"]: row for row in read_metrics(os.path.join(reference_dir, "metrics.jsonl"))}


def _assert_same_steps(run_dir: str, expected: dict[int, dict]) -> None:
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1)), "each step once, in order"
    for row in rows:
        for key in COMPARED:
            assert row[key] == pytest.approx(expected[row["step"]][key], rel=1e-5, abs=1e-7), (row["step"], key)


def test_killed_during_checkpoint_resumes_like_an_uninterrupted_run(job, tmp_path, expected):
    crashed_dir = str(tmp_path / "crashed")

    crashed = run_train(crashed_dir, _overrides(job),
                        env_extra={"RL_KILL_AT": "checkpoint_written:2"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    root = os.path.join(crashed_dir, "checkpoints")
    assert os.path.isdir(os.path.join(root, "global_step_2.partial")), os.listdir(root)
    assert checkpoint.latest(root) == os.path.join(root, "global_step_1")

    resumed = run_train(crashed_dir, [*_overrides(job), "trainer.resume_mode=latest"])
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    assert "resumed from" in resumed.stdout and "global_step_1 (step 1)" in resumed.stdout

    _assert_same_steps(crashed_dir, expected)
    assert checkpoint.latest(root) == os.path.join(root, f"global_step_{STEPS}")


def test_crash_before_the_first_checkpoint_then_resume_logs_each_step_once(job, tmp_path, expected):
    """Nothing complete to resume from: the run starts over and the earlier attempt's rows (and a line torn by the
    crash) do not stay in metrics.jsonl."""
    run_dir = str(tmp_path / "crashed")
    crashed = run_train(run_dir, _overrides(job), env_extra={"RL_KILL_AT": "checkpoint_written:1"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert checkpoint.latest(os.path.join(run_dir, "checkpoints")) is None
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write('{"step": 2, "loss": 0.')  # a write cut short by the crash
    resumed = run_train(run_dir, [*_overrides(job), "trainer.resume_mode=latest"])
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    _assert_same_steps(run_dir, expected)


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
