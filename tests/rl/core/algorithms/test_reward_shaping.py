"""Dynamic-sampling groups, the overlong penalty and pass@k against hand-computed values."""

import pytest
import torch

from rl.core.algorithms.reward_shaping import (
    groups_with_signal,
    overlong_penalty,
    pass_and_mean_at_k,
    zero_variance_samples,
)


def test_groups_with_signal_marks_groups_whose_rewards_differ():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.50001])
    assert groups_with_signal(rewards, 3).tolist() == [False, True, False, True]
    assert groups_with_signal(rewards, 1).all()


def test_overlong_penalty_ramps_over_the_last_band_tokens():
    lengths = torch.tensor([10, 24, 25, 28, 32])
    # max 32, band 8: free up to 24, then -(L - 24) / 8 * 0.5
    assert overlong_penalty(lengths, 32, 8, 0.5).tolist() == pytest.approx([0.0, 0.0, -0.0625, -0.25, -0.5])
    assert overlong_penalty(lengths, 32, 0, 0.5).tolist() == [0.0] * 5


def test_pass_and_mean_at_k_by_hand():
    # 3 prompts x 4 samples: prompt 0 solved once, prompt 1 never, prompt 2 twice (0.5 partial credit counts)
    rewards = torch.tensor([0, 0, 1, 0, 0, 0, 0, 0, 0.5, 0, 1, 0], dtype=torch.float32)
    pass_k, mean_k = pass_and_mean_at_k(rewards, 4)
    assert pass_k == pytest.approx(2 / 3)
    assert mean_k == pytest.approx(2.5 / 12)
    assert pass_and_mean_at_k(rewards, 1) == (pytest.approx(3 / 12), pytest.approx(2.5 / 12))


def test_zero_variance_samples_follow_skyrl_rule():
    """A prompt leaves when more than one of its samples is live and their rewards spread by at most tol; samples
    already out of the loss (not live) neither make a prompt vary nor count."""
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0, 2.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert zero_variance_samples(rewards, groups, 0.0).tolist() == [True, True, False, False, True, True, True, True]
    live = torch.tensor([True, True, False, True, True, True, True, False])
    # prompt 1 keeps one live sample, prompt 3 too: both stay
    assert zero_variance_samples(rewards, groups, 0.0, live).tolist() == [True, True, False, False, True, True,
                                                                         False, False]
    assert zero_variance_samples(rewards, groups, 1.0).tolist() == [True] * 8
    assert zero_variance_samples(torch.tensor([0.3, 0.3 + 1e-7]), torch.tensor([5, 5]), 1e-6).tolist() == [True, True]
