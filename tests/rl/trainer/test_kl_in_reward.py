"""The KL penalty in the reward (`trainer.algorithm.use_kl_in_reward`) with overlong filtering
(`generator.apply_overlong_filtering`): a response cut at the length limit keeps no loss token, and its outcome must
still count in its group's baseline, as it does without the penalty (and in SkyRL, whose token rewards carry the
outcome on the response's last token whatever its loss mask).

Oracles: at beta = 0 the advantages equal those of the path without KL in the reward, for every estimator that reads
row sums; at beta > 0, GRPO's formula by hand over row sums of outcome - beta * (old - ref) on the loss tokens (k1)."""

from __future__ import annotations

import pytest
import torch

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import load_config
from rl.core.generation import Rollout
from rl.trainer.experience import assign_advantages, build_experience
from rl.trainer.kl_reward import KLInReward

GROUPS, SAMPLES = 6, 3  # an 18-row batch
EPSILON = 1e-6  # GRPO's epsilon (rl.core.algorithms.advantages.grpo's default)


def _batch(seed: int = 0):
    """18 responses of 1-6 tokens, every third cut at the length limit; rewards in {0, 1}, varied in each group;
    old and reference logprobs on every token."""
    generator = torch.Generator().manual_seed(seed)
    rollouts, rewards = [], []
    for row in range(GROUPS * SAMPLES):
        length = 1 + row % 6
        cut = row % 3 == 0
        rollouts.append(Rollout(row // SAMPLES, row % SAMPLES, [5, 6], list(range(7, 7 + length)), [-1.0] * length,
                                None, "length" if cut else "stop", ""))
        rewards.append(float(row % 2))  # cut rows 0, 3, 6, ... score 0, 1, 0, ...
    experience = build_experience(rollouts, torch.tensor(rewards), overlong_filtering=True)
    for sequence in experience.sequences:
        width = len(sequence["input_ids"])
        sequence["old_logprobs"] = -torch.rand(width, generator=generator)
        sequence["ref_logprobs"] = -torch.rand(width, generator=generator)
    return experience


def _kl_in_reward(beta: float) -> KLInReward:
    cfg = load_config(["trainer.algorithm.use_kl_in_reward=true", "trainer.algorithm.use_kl_loss=false",
                       f"trainer.algorithm.kl_loss_coef={beta}",
                       "trainer.algorithm.kl_ctrl.type=fixed", "trainer.algorithm.kl_estimator_type=k1"])
    return KLInReward(cfg.trainer.algorithm)


def test_the_batch_has_cut_responses_in_groups_that_vary():
    experience = _batch()
    mask = experience.responses("loss_mask").bool()
    cut = ~mask.any(dim=1)
    assert cut.sum() == 6 and experience.rewards[cut].sum() > 0  # cut responses whose outcome is not zero


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_at_beta_zero_the_advantages_are_those_without_kl_in_the_reward(estimator):
    plain, penalized = _batch(), _batch()
    assign_advantages(plain, estimator, True)
    token_rewards, metrics = _kl_in_reward(0.0).token_rewards(penalized)
    assign_advantages(penalized, estimator, True, token_rewards=token_rewards)
    assert metrics["kl_in_reward_coef"] == 0.0
    torch.testing.assert_close(penalized.responses("advantages"), plain.responses("advantages"), rtol=0, atol=0)
    # the rows sum to the outcomes, the cut responses' included
    torch.testing.assert_close(token_rewards.sum(dim=1), plain.rewards.float(), rtol=0, atol=0)


def test_with_a_penalty_grpo_scores_each_row_by_its_outcome_less_its_kl():
    beta = 0.5
    experience = _batch()
    mask = experience.responses("loss_mask")
    kl = (experience.responses("old_logprobs") - experience.responses("ref_logprobs")) * mask  # k1 on loss tokens
    scores = experience.rewards.float() - beta * kl.sum(dim=1)
    grouped = scores.view(GROUPS, SAMPLES)
    want = ((grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + EPSILON)).flatten()
    token_rewards, metrics = _kl_in_reward(beta).token_rewards(experience)
    assign_advantages(experience, "grpo", True, token_rewards=token_rewards)
    got = experience.responses("advantages")
    # each row's advantage on its loss tokens; the sums and the group statistics are over a few float32 values, so
    # they agree to a few units of float32 rounding of numbers of size ~1
    torch.testing.assert_close(got, want[:, None] * mask, rtol=0, atol=1e-5)
    assert metrics["kl_in_reward_coef"] == beta


def test_the_adaptive_controller_moves_beta_by_the_batchs_kl_and_its_state_travels():
    """The batch's KL (the mean over sequences of each sequence's mean k1 over its loss tokens; a cut response
    counts with 0) is reported, and beta moves as veRL's adaptive controller moves it: beta * (1 + clip(kl / target
    - 1, -0.2, 0.2) * sequences / horizon); the new beta is what the checkpoint keeps."""
    cfg = load_config(["trainer.algorithm.use_kl_in_reward=true", "trainer.algorithm.use_kl_loss=false",
                       "trainer.algorithm.kl_loss_coef=0.5", "trainer.algorithm.kl_ctrl.type=adaptive",
                       "trainer.algorithm.kl_ctrl.kl_target=0.1", "trainer.algorithm.kl_ctrl.horizon=100",
                       "trainer.algorithm.kl_estimator_type=k1"])
    experience = _batch()
    mask = experience.responses("loss_mask")
    k1 = (experience.responses("old_logprobs") - experience.responses("ref_logprobs")) * mask
    per_sequence = k1.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    kl = float(per_sequence.mean())
    beta = 0.5 * (1 + min(max(kl / 0.1 - 1, -0.2), 0.2) * GROUPS * SAMPLES / 100)
    penalty = KLInReward(cfg.trainer.algorithm)
    _, metrics = penalty.token_rewards(experience)
    assert metrics["kl_in_reward"] == pytest.approx(kl, rel=1e-6)  # float32 sums of at most 6 terms, then 18
    assert metrics["kl_in_reward_coef"] == 0.5  # the beta this batch was penalised with
    assert penalty.controller.value == pytest.approx(beta, rel=1e-6) and beta != 0.5
    resumed = KLInReward(cfg.trainer.algorithm)
    resumed.load_state_dict(penalty.state_dict())
    assert resumed.controller.value == penalty.controller.value
