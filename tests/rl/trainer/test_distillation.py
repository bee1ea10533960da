"""On-policy distillation and the KL penalty in the reward through the real launcher (SkyRL's recipe): a teacher as
the reference (`trainer.ref.model.path`), `advantage_estimator=no_op`, `policy_loss_type=importance_sampling`,
`use_kl_in_reward=true` with the adaptive controller.

- The loop applies the controller as veRL and SkyRL define it: the coefficient of step 2 is the hand-computed
  beta_1 * (1 + clip(kl_1 / target - 1, -0.2, 0.2) * sequences / horizon) from step 1's logged KL; the first step's
  policy loss is the batch's mean KL (importance sampling at ratio 1 of advantages -beta * kl per token).
- A run resumed from step 1's checkpoint continues with the coefficient the controller had reached.
- A teacher with another tokenizer is refused before Ray starts, naming the key.
"""

import shutil

import pytest
import torch

from rl.trainer.state.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.launcher import launch_refused
from tests.testing.tiny_job import make_tiny_job, run_train

TARGET, HORIZON, BETA = 0.01, 20, 0.5
SEQUENCES = 16  # train_batch_size 4 x n_samples_per_prompt 4 (TinyJob)
MAX_NEW_TOKENS = 12  # TinyJob's generator.max_generate_length
DISTILL = ("trainer.algorithm.advantage_estimator=no_op", "trainer.algorithm.policy_loss_type=importance_sampling",
           "trainer.algorithm.use_kl_in_reward=true", "trainer.algorithm.use_kl_loss=false",
           "trainer.algorithm.kl_ctrl.type=adaptive", f"trainer.algorithm.kl_ctrl.kl_target={TARGET}",
           f"trainer.algorithm.kl_ctrl.horizon={HORIZON}", f"trainer.algorithm.kl_loss_coef={BETA}")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("jobs")
    return make_tiny_job(str(root / "student")), make_tiny_job(str(root / "teacher"), seed=7)


def _rows(run_dir):
    return {row["step"]: row for row in read_metrics(f"{run_dir}/metrics.jsonl") if "kl_in_reward" in row}


def test_the_adaptive_coefficient_follows_the_measured_kl_and_survives_a_resume(jobs, tmp_path):
    student, teacher = jobs
    overrides = [*student.overrides(steps=2), *DISTILL, f"trainer.ref.model.path={teacher.model_path}",
                 "trainer.ckpt_interval=1"]
    first = str(tmp_path / "first")
    result = run_train(first, overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = _rows(first)
    kl = rows[1]["kl_in_reward"]
    assert kl > TARGET * 1.2, "a random teacher sits far from the student: the error is clipped at +0.2"
    assert rows[1]["kl_in_reward_coef"] == BETA
    error = min(max(kl / TARGET - 1, -0.2), 0.2)
    # the controller's own operations, in its order, on the logged (JSON round-trips doubles exactly) KL: bit-equal
    assert rows[2]["kl_in_reward_coef"] == BETA * (1 + error * SEQUENCES / HORIZON)
    # ratio 1 at the first step: the loss is the token mean of beta * kl (kl logged by the loss over the same tokens);
    # the two are float32 sums of the same non-negative terms with beta applied before or after: a reordered sum
    rtol = 2 * tolerances.gamma(SEQUENCES * MAX_NEW_TOKENS + 2, torch.float32)
    assert rows[1]["pg_loss"] == pytest.approx(BETA * rows[1]["kl"], rel=rtol)
    # resumed from step 1: step 2 takes the coefficient the controller reached, not the configured one
    second = str(tmp_path / "second")
    shutil.copytree(f"{first}/checkpoints/global_step_1", f"{second}/checkpoints/global_step_1")
    result = run_train(second, [*overrides, "trainer.resume_mode=latest"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "resumed from" in result.stdout
    assert _rows(second)[2]["kl_in_reward_coef"] == rows[2]["kl_in_reward_coef"]


def test_a_teacher_with_another_tokenizer_is_refused(jobs, tmp_path, capsys):
    from transformers import AutoTokenizer

    student, teacher = jobs
    other = tmp_path / "other"
    shutil.copytree(teacher.model_path, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(other)
    message = launch_refused(str(tmp_path / "run"), [*student.overrides(), *DISTILL,
                                                     f"trainer.ref.model.path={other}"], capsys)
    assert "trainer.ref.model.path" in message and "does not use the policy's tokenizer" in message
