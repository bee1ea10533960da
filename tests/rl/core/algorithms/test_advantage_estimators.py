"""Advantage estimators against hand-computed values and naive per-group / per-row Python references."""

import math
import statistics

import pytest
import torch

from rl.core.algorithms import ADVANTAGE_ESTIMATORS, compute_advantages
from tests.testing.tolerances import assert_within, gamma

EPS = 1e-6


def mask_from_lengths(lengths, width):
    return (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(torch.float64)


def test_registry_names():
    assert ADVANTAGE_ESTIMATORS.names() == ["gae", "grpo", "no_op", "reinforce++", "rloo"]
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


def assert_hand(got, want, ops=32):
    """float64 both sides, each within gamma_ops (Higham) of the exact value relative to the magnitudes met (the
    largest |want|: returns, means and whitened values of order one), so they differ by <= 2 * gamma_ops * that."""
    want = torch.as_tensor(want, dtype=torch.float64)
    assert_within(got, want, 2 * gamma(ops, torch.float64) * float(want.abs().max()))


def test_reinforce_plus_plus_carries_returns_through_observation_spans():
    # gamma 0.5; row 0 is a two-turn episode: policy tokens 0-1, observation tokens 2-3, policy tokens 4-5, reward
    # 1 on t=5: returns t5 1, t4 0.5, t3 and t2 0 (the running 0.5 passes through undiscounted), t1 0.25, t0 0.125.
    # row 1: three policy tokens, reward 2 on t=2: returns [0.5, 1, 2]. Whitening over the seven policy tokens.
    rewards = torch.tensor([1.0, 2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    adv, returns = compute_advantages("reinforce++", rewards, mask, gamma=0.5)
    want = [[0.125, 0.25, 0.0, 0.0, 0.5, 1.0], [0.5, 1.0, 2.0, 0.0, 0.0, 0.0]]
    assert_hand(returns, want)
    valid = [0.125, 0.25, 0.5, 1.0, 0.5, 1.0, 2.0]
    mean, std = statistics.mean(valid), math.sqrt(statistics.variance(valid) + 1e-8)
    white = torch.tensor(want, dtype=torch.float64).sub(mean).div(std) * mask
    assert_hand(adv, white)


def test_no_op_passes_the_token_rewards_through():
    # SkyRL's no_op: advantages = returns = the token rewards (masked); without them, the outcome on the last token
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    token_rewards = torch.tensor([[-0.5, 0.25, 1.0], [0.3, -0.1, 7.0]], dtype=torch.float64)
    adv, returns = compute_advantages("no_op", torch.zeros(2, dtype=torch.float64), mask, token_rewards=token_rewards)
    assert torch.equal(adv, torch.tensor([[-0.5, 0.25, 1.0], [0.3, -0.1, 0.0]], dtype=torch.float64))
    assert torch.equal(returns, adv)
    adv, _ = compute_advantages("no_op", torch.tensor([2.0, 3.0], dtype=torch.float64), mask)
    assert torch.equal(adv, torch.tensor([[0.0, 0.0, 2.0], [0.0, 3.0, 0.0]], dtype=torch.float64))


def test_outcome_estimators_score_token_rewards_by_their_row_sums():
    # grpo on token rewards = grpo on their row sums: [1 - 0.25, 0 - 0.5, 0.5 + 0.25] = [0.75, -0.5, 0.75]
    # one group: mean 1/3, unbiased var ((5/12)^2 * 2 + (5/6)^2) / 2 = 25/48 -> std 5 / sqrt(48)
    mask = torch.ones(3, 2, dtype=torch.bool)
    token_rewards = torch.tensor([[-0.25, 1.0], [-0.5, 0.0], [0.25, 0.5]], dtype=torch.float64)
    groups = torch.zeros(3, dtype=torch.long)
    adv, _ = compute_advantages(
        "grpo", torch.zeros(3, dtype=torch.float64), mask, groups, epsilon=0.0, token_rewards=token_rewards
    )
    std = 5 / math.sqrt(48)
    assert_hand(adv[:, 0], [(0.75 - 1 / 3) / std, (-0.5 - 1 / 3) / std, (0.75 - 1 / 3) / std])
    rloo, _ = compute_advantages("rloo", torch.zeros(3, dtype=torch.float64), mask, groups, token_rewards=token_rewards)
    assert_hand(rloo[:, 0], [0.75 - 0.125, -0.5 - 0.75, 0.75 - 0.125])


def test_per_token_estimators_read_token_rewards_per_token():
    # reinforce++, gamma 1: token rewards [0.5, 0, 1] -> returns [1.5, 1, 1]; row 1 [0, -1, 2] -> [1, 1, 2]
    mask = torch.ones(2, 3, dtype=torch.bool)
    token_rewards = torch.tensor([[0.5, 0.0, 1.0], [0.0, -1.0, 2.0]], dtype=torch.float64)
    _, returns = compute_advantages(
        "reinforce++", torch.zeros(2, dtype=torch.float64), mask, gamma=1.0, token_rewards=token_rewards
    )
    assert_hand(returns, [[1.5, 1.0, 1.0], [1.0, 1.0, 2.0]])
    # gae with zero values and gamma = lambda = 1: the advantages before whitening are the same reward-to-go
    _, returns = compute_advantages(
        "gae",
        torch.zeros(2, dtype=torch.float64),
        mask,
        values=torch.zeros(2, 3, dtype=torch.float64),
        token_rewards=token_rewards,
    )
    assert_hand(returns, [[1.5, 1.0, 1.0], [1.0, 1.0, 2.0]])


def test_token_rewards_shape_is_checked():
    with pytest.raises(ValueError, match="token_rewards"):
        compute_advantages("no_op", torch.ones(2), torch.ones(2, 3), token_rewards=torch.ones(2, 4))


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
