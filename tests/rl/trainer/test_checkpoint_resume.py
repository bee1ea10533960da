"""A run SIGKILLed in the middle of a checkpoint write resumes from the last complete one and then produces the
same metrics as a run that was never interrupted; the half-written checkpoint is never loaded. Damaged shards of
the newest checkpoints are named and passed over the same way. A checkpoint resumed under another strategy is refused
before anything starts, and `rl.launch.convert` turns it into a Hugging Face model instead."""

import os
import shutil
import signal

import pytest

from rl.trainer.state import checkpoint
from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

STEPS = 4  # three checkpoints to damage beside the oldest
COMPARED = ("reward_mean", "loss", "pg_loss", "grad_norm", "kl", "entropy")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _overrides(job):
    return [*job.overrides(steps=STEPS), "trainer.ckpt_interval=1", "data.reward_fn=gsm8k_flexible",
            "trainer.algorithm.use_entropy_loss=true"]


@pytest.fixture(scope="module")
def reference_dir(job, tmp_path_factory) -> str:
    """The run that was never interrupted (a checkpoint every step)."""
    run_dir = str(tmp_path_factory.mktemp("reference"))
    reference = run_train(run_dir, _overrides(job))
    assert reference.returncode == 0, reference.stderr[-5000:]
    return run_dir


@pytest.fixture(scope="module")
def expected(reference_dir) -> dict[int, dict]:
    """Per-step metrics of the run that was never interrupted."""
    return {row["step"]: row for row in read_metrics(os.path.join(reference_dir, "metrics.jsonl"))}


def _assert_same_steps(run_dir: str, expected: dict[int, dict]) -> None:
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1)), "each step once, in order"
    # A resumed run restores the weights, Adam's moments and step count, the data order and the sampling seeds
    # (functions of the step) exactly, then runs the same operations in the same order: every metric is identical.
    for row in rows:
        for key in COMPARED:
            assert row[key] == expected[row["step"]][key], (row["step"], key, row[key], expected[row["step"]][key])


def test_crashes_in_checkpoint_writes_resume_like_an_uninterrupted_run(job, tmp_path, expected):
    """SIGKILLed while writing the first checkpoint: nothing complete to resume from, so the next attempt starts over,
    and the earlier attempt's rows (and a line torn by the crash) do not stay in metrics.jsonl. That attempt is
    SIGKILLed while writing step 3's checkpoint: the last attempt resumes from step 2's, never from the half-written
    one, and logs what a run never interrupted logged, each step once."""
    run_dir = str(tmp_path / "crashed")
    root = os.path.join(run_dir, "checkpoints")
    crashed = run_train(run_dir, _overrides(job), env_extra={"RL_KILL_AT": "checkpoint_written:1"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert checkpoint.latest(root) is None
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write('{"step": 2, "loss": 0.')  # a write cut short by the crash

    crashed = run_train(run_dir, [*_overrides(job), "trainer.resume_mode=latest"],
                        env_extra={"RL_KILL_AT": "checkpoint_written:3"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert os.path.isdir(os.path.join(root, "global_step_3.partial")), os.listdir(root)
    assert checkpoint.latest(root) == os.path.join(root, "global_step_2")

    resumed = run_train(run_dir, [*_overrides(job), "trainer.resume_mode=latest"])
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    assert "resumed from" in resumed.stdout and "global_step_2 (step 2)" in resumed.stdout
    _assert_same_steps(run_dir, expected)
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


def _damage(path: str, how: str) -> None:
    if how == "deleted":
        os.remove(path)
        return
    with open(path, "r+b") as f:
        if how == "truncated":
            f.truncate(os.path.getsize(path) // 2)
        else:
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x5A]))


def test_damaged_checkpoints_are_named_and_resume_falls_back_to_the_newest_intact_one(job, reference_dir, expected,
                                                                                      tmp_path):
    """After the run, the largest shard of each of the three newest checkpoints damaged in one of three ways (a byte
    flipped, cut to half, deleted): resume names each of them with its file, goes back to the oldest checkpoint and
    then logs the same metrics as the run that was never damaged."""
    run_dir = str(tmp_path / "damaged")
    shutil.copytree(reference_dir, run_dir, ignore=shutil.ignore_patterns("ray"))
    damaged = {}
    for step, how in zip(range(STEPS, 1, -1), ("flipped", "truncated", "deleted"), strict=True):
        saved = os.path.join(run_dir, "checkpoints", f"global_step_{step}")
        files = [os.path.join(parent, name) for parent, _, names in os.walk(saved) for name in names]
        shard = max(files, key=os.path.getsize)
        _damage(shard, how)
        damaged[saved] = shard

    resumed = run_train(run_dir, [*_overrides(job), "trainer.resume_mode=latest"])
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    said = resumed.stdout + resumed.stderr
    for saved, shard in damaged.items():
        assert f"checkpoint {saved} is damaged" in said and os.path.relpath(shard, saved) in said, saved
    assert "global_step_1 (step 1)" in resumed.stdout
    _assert_same_steps(run_dir, expected)


def test_checkpoint_of_another_strategy_is_refused_and_converts_to_hugging_face(job, reference_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from rl.launch.convert import training_checkpoint_to_hf

    saved = os.path.join(reference_dir, "checkpoints", f"global_step_{STEPS}")
    state = checkpoint.read_trainer_state(saved)
    assert state["model_path"] == os.path.abspath(job.model_path)
    other = "megatron" if state["strategy"] != "megatron" else "fsdp2"
    refused = run_train(str(tmp_path / "other"), [*_overrides(job), f"trainer.strategy={other}",
                                                  f"trainer.resume_mode={saved}"], timeout=60)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert f"trainer.resume_mode: {saved} was written by the {state['strategy']} strategy" in refused.stderr
    assert "--direction=checkpoint_to_hf" in refused.stderr and "Traceback" not in refused.stderr

    out = str(tmp_path / "hf")
    training_checkpoint_to_hf(saved, out, None, None)
    trained = AutoModelForCausalLM.from_pretrained(out).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(job.model_path).state_dict()
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[name], initial[name]) for name in initial), "the trained weights"
    with pytest.raises(FileExistsError, match="never overwritten"):
        training_checkpoint_to_hf(saved, out, None, None)
