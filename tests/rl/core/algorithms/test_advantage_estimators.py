"""Advantage estimators against hand-computed values and naive per-group / per-row Python references."""

import math
import statistics

import pytest
import torch

from rl.core.algorithms import ADVANTAGE_ESTIMATORS, compute_advantages

EPS = 1e-6


def mask_from_lengths(lengths, width):
    return (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(torch.float64)


def test_registry_names():
    assert ADVANTAGE_ESTIMATORS.names() == ["gae", "grpo", "reinforce++", "rloo"]
    with pytest.raises(KeyError, match="grpo"):
        ADVANTAGE_ESTIMATORS.get("grp0")


def test_grpo_hand_computed():
    # groups: 7 -> rewards [1, 0, 0.5]: mean 0.5, unbiased var (0.25 + 0.25 + 0) / 2 = 0.25, std 0.5
    #         3 -> rewards [2, 4]:      mean 3,   unbiased var (1 + 1) / 1 = 2,            std sqrt(2)
    #         5 -> reward [3] alone:    mean 0, std 1 (veRL convention for a group of one)
    rewards = torch.tensor([1.0, 2.0, 0.0, 3.0, 4.0, 0.5], dtype=torch.float64)
    groups = torch.tensor([7, 3, 7, 5, 3, 7])
    mask = mask_from_lengths([3, 1, 2, 3, 2, 1], 3)
    adv, returns = compute_advantages("grpo", rewards, mask, groups, norm_by_std=True, epsilon=EPS)
    s2 = math.sqrt(2.0)
    expected = [0.5 / (0.5 + EPS), -1 / (s2 + EPS), -0.5 / (0.5 + EPS), 3 / (1 + EPS), 1 / (s2 + EPS), 0.0]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64).unsqueeze(1) * mask)
    torch.testing.assert_close(returns, adv)
    adv_no_std, _ = compute_advantages("grpo", rewards, mask, groups, norm_by_std=False)
    expected_no_std = torch.tensor([0.5, -1.0, -0.5, 3.0, 1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(adv_no_std, expected_no_std.unsqueeze(1) * mask)


def test_grpo_matches_naive_group_loop():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(40, generator=gen, dtype=torch.float64)
    groups = torch.randint(0, 9, (40,), generator=gen)
    mask = mask_from_lengths(torch.randint(1, 6, (40,), generator=gen).tolist(), 5)
    adv, _ = compute_advantages("grpo", rewards, mask, groups, norm_by_std=True, epsilon=EPS)
    for i in range(40):
        members = [rewards[j].item() for j in range(40) if groups[j] == groups[i]]
        if len(members) == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = statistics.mean(members), statistics.stdev(members)
        want = (rewards[i].item() - mean) / (std + EPS)
        torch.testing.assert_close(adv[i], torch.full((5,), want, dtype=torch.float64) * mask[i])


def test_rloo_hand_computed():
    # group 7 = [1, 0, 0.5], group 3 = [2, 4]; baseline = mean of the OTHER members of the group
    # 1 - (0 + 0.5) / 2 = 0.75;  2 - 4 = -2;  0 - (1 + 0.5) / 2 = -0.75;  4 - 2 = 2;  0.5 - (1 + 0) / 2 = 0
    rewards = torch.tensor([1.0, 2.0, 0.0, 4.0, 0.5], dtype=torch.float64)
    groups = torch.tensor([7, 3, 7, 3, 7])
    mask = mask_from_lengths([2, 2, 1, 2, 2], 2)
    adv, _ = compute_advantages("rloo", rewards, mask, groups)
    expected = torch.tensor([0.75, -2.0, -0.75, 2.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(adv, expected.unsqueeze(1) * mask)


def test_rloo_single_response_group_is_an_error():
    rewards = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"at least 2 responses.*\[11\]"):
        compute_advantages("rloo", rewards, torch.ones(3, 2), torch.tensor([4, 4, 11]))


def test_reinforce_plus_plus_hand_computed():
    # gamma 0.5; token rewards: row 0 [0, 1, 0] (last valid token t=1), row 1 [0, 0, 2]
    # reward-to-go: row 0 [0.5, 1, -], row 1 [0.5, 1, 2]
    # valid returns [0.5, 1, 0.5, 1, 2]: mean 1, deviations [-0.5, 0, -0.5, 0, 1],
    # unbiased var (0.25 + 0.25 + 1) / 4 = 0.375 -> advantages = deviation / sqrt(0.375 + 1e-8)
    rewards = torch.tensor([1.0, 2.0], dtype=torch.float64)
    mask = mask_from_lengths([2, 3], 3)
    adv, returns = compute_advantages("reinforce++", rewards, mask, gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.5, 1.0, 0.0], [0.5, 1.0, 2.0]], dtype=torch.float64))
    scale = 1 / math.sqrt(0.375 + 1e-8)
    expected = torch.tensor([[-0.5, 0.0, 0.0], [-0.5, 0.0, 1.0]], dtype=torch.float64) * scale
    torch.testing.assert_close(adv, expected)


def test_gae_hand_computed():
    # gamma 0.9, lambda 0.8 (gamma * lambda = 0.72)
    # row 0: values [0.5, 0.25, pad], reward 1 on t=1
    #   t=1: delta = 1 + 0 - 0.25 = 0.75                 -> A = 0.75
    #   t=0: delta = 0 + 0.9 * 0.25 - 0.5 = -0.275       -> A = -0.275 + 0.72 * 0.75 = 0.265
    # row 1: values [0, 1, 0.5], reward 2 on t=2
    #   t=2: delta = 2 - 0.5 = 1.5                       -> A = 1.5
    #   t=1: delta = 0.9 * 0.5 - 1 = -0.55               -> A = -0.55 + 0.72 * 1.5 = 0.53
    #   t=0: delta = 0.9 * 1 - 0 = 0.9                   -> A = 0.9 + 0.72 * 0.53 = 1.2816
    # returns = A + V: row 0 [0.765, 1.0, -], row 1 [1.2816, 1.53, 2.0]; A then whitened over valid tokens
    rewards = torch.tensor([1.0, 2.0], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.25, 9.0], [0.0, 1.0, 0.5]], dtype=torch.float64)
    mask = mask_from_lengths([2, 3], 3)
    adv, returns = compute_advantages("gae", rewards, mask, values=values, gamma=0.9, lambd=0.8)
    torch.testing.assert_close(returns, torch.tensor([[0.765, 1.0, 0.0], [1.2816, 1.53, 2.0]], dtype=torch.float64))
    raw = [0.265, 0.75, 1.2816, 0.53, 1.5]
    mean, var = statistics.mean(raw), statistics.variance(raw)
    white = [(a - mean) / math.sqrt(var + 1e-8) for a in raw]
    expected = torch.tensor([[white[0], white[1], 0.0], [white[2], white[3], white[4]]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected)


def naive_gae_row(reward, values, length, gamma, lambd):
    advantages = [0.0] * length
    running = 0.0
    for t in reversed(range(length)):
        next_value = values[t + 1] if t + 1 < length else 0.0
        r = reward if t == length - 1 else 0.0
        running = r + gamma * next_value - values[t] + gamma * lambd * running
        advantages[t] = running
    return advantages


def test_gae_matches_naive_row_loop():
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 7, (6,), generator=gen).tolist()
    rewards = torch.randn(6, generator=gen, dtype=torch.float64)
    values = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    mask = mask_from_lengths(lengths, 6)
    adv, returns = compute_advantages("gae", rewards, mask, values=values, gamma=0.95, lambd=0.9)
    raw = []
    for i, length in enumerate(lengths):
        row = naive_gae_row(rewards[i].item(), values[i].tolist(), length, 0.95, 0.9)
        raw.extend(row)
        want_returns = [a + v for a, v in zip(row, values[i].tolist(), strict=False)] + [0.0] * (6 - length)
        torch.testing.assert_close(returns[i], torch.tensor(want_returns, dtype=torch.float64))
    mean, std = statistics.mean(raw), math.sqrt(statistics.variance(raw) + 1e-8)
    torch.testing.assert_close(adv[mask.bool()], torch.tensor([(a - mean) / std for a in raw], dtype=torch.float64))
    assert bool((adv[~mask.bool()] == 0).all())


def test_gae_without_values_names_the_argument():
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", torch.ones(2), torch.ones(2, 3))


def test_shape_errors_name_the_argument():
    with pytest.raises(ValueError, match="rewards"):
        compute_advantages("grpo", torch.ones(3), torch.ones(2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match="group_index"):
        compute_advantages("grpo", torch.ones(2), torch.ones(2, 3))
