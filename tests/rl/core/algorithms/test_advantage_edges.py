"""Advantage estimators at their edges: input checks shared by every estimator, defaults, rows without tokens,
low-precision rewards, observation spans in GAE and whitening's smallest batch, against hand-computed values."""

import math

import pytest
import torch

from rl.core.algorithms import ADVANTAGE_ESTIMATORS, compute_advantages, masked_whiten
from rl.core.algorithms.advantages import last_token_rewards
from tests.testing.tolerances import assert_within, gamma, unit_roundoff

F64 = torch.float64
ESTIMATORS = ADVANTAGE_ESTIMATORS.names()


def assert_hand(got, want, ops=32, scale=None):
    """float64 both sides within 2 * gamma_ops of the magnitudes met (`scale`, default |want|); NaN never passes."""
    want = torch.as_tensor(want, dtype=F64)
    assert not bool(torch.isnan(got).any()), f"NaN in {got}"
    scale = want.abs() if scale is None else torch.as_tensor(scale, dtype=F64)
    assert_within(got, want, 2 * gamma(ops, F64) * scale)


def call(name, rewards, mask, group_index=None, **options):
    if name == "gae":
        options.setdefault("values", torch.zeros(mask.shape, dtype=F64))
    if name in ("grpo", "rloo") and group_index is None:
        group_index = torch.zeros(rewards.shape, dtype=torch.long)
    return compute_advantages(name, rewards, mask, group_index, **options)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_every_estimator_checks_its_inputs_and_names_them(name):
    rewards, mask = torch.ones(2, dtype=F64), torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"^response_mask must be \[B, T\], got shape \(6,\)$"):
        call(name, rewards, torch.ones(6))
    with pytest.raises(ValueError, match=r"^rewards must be \[B\] with B=2 \(one per response\), got \(3,\)$"):
        call(name, torch.ones(3, dtype=F64), mask)
    with pytest.raises(ValueError, match=r"^group_index must be \[B\]=\(2,\), got \(3,\)$"):
        call(name, rewards, mask, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^token_rewards must be \[B, T\]=\(2, 3\) like response_mask, got \(2, 4\)$"):
        call(name, rewards, mask, token_rewards=torch.ones(2, 4, dtype=F64))


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_group_estimators_need_the_group_index(name):
    with pytest.raises(ValueError, match=r"^group_index is required: pass the prompt id of every response$"):
        compute_advantages(name, torch.ones(2), torch.ones(2, 3))


def test_rloo_names_the_lonely_groups_and_the_key_to_raise():
    # eleven prompts with one response each: the message lists the first ten
    groups = torch.arange(11)
    with pytest.raises(ValueError, match=r"^rloo needs at least 2 responses per prompt; group_index values "
                                         r"\[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\] have a single response. "
                                         r"Set generator.n_samples_per_prompt >= 2$"):
        compute_advantages("rloo", torch.ones(11), torch.ones(11, 2), groups)


def test_grpo_default_epsilon():
    # one group [1, 0]: mean 0.5, std sqrt(0.5); (r - mean) / (std + 1e-6)
    adv, _ = compute_advantages("grpo", torch.tensor([1.0, 0.0], dtype=F64), torch.ones(2, 1), torch.zeros(2))
    s = math.sqrt(0.5) + 1e-6
    assert_hand(adv[:, 0], [0.5 / s, -0.5 / s])


def test_grpo_scores_token_rewards_by_their_row_sums():
    # rewards [5, 5] would score 0; the token rewards' row sums [1, -1] score +-1 / (sqrt(2) + eps)
    mask = torch.ones(2, 2)
    token_rewards = torch.tensor([[0.5, 0.5], [-1.0, 0.0]], dtype=F64)
    adv, _ = compute_advantages("grpo", torch.full((2,), 5.0, dtype=F64), mask, torch.zeros(2),
                                token_rewards=token_rewards, epsilon=0.0)
    assert_hand(adv, [[1 / math.sqrt(2)] * 2, [-1 / math.sqrt(2)] * 2])


def test_low_precision_rewards_are_scored_in_float32():
    # bf16 rewards [1, 0]: 0.5 / sqrt(0.5) = sqrt(0.5), a few float32 roundings away (bf16 would be 1e-4 off)
    rewards = torch.tensor([1.0, 0.0], dtype=torch.bfloat16)
    adv, _ = compute_advantages("grpo", rewards, torch.ones(2, 1), torch.zeros(2), epsilon=0.0)
    assert adv.dtype == torch.float32
    assert not bool(adv.isnan().any())
    assert_within(adv[:, 0], torch.tensor([math.sqrt(0.5), -math.sqrt(0.5)]), 8 * unit_roundoff(torch.float32))


def test_a_row_without_response_tokens_gets_no_reward():
    # row 1 has no token: its outcome lands nowhere (not as inf or NaN on its first position)
    mask = torch.tensor([[0, 1, 1], [0, 0, 0], [1, 0, 0]])
    got = last_token_rewards(torch.tensor([2.0, 3.0, -1.0], dtype=F64), mask)
    assert got.tolist() == [[0.0, 0.0, 2.0], [0.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]


def test_reinforce_plus_plus_default_gamma_is_one():
    # reward 2 on the last of three tokens, undiscounted: returns [2, 2, 2]; row 1: [1, 1, 0]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    _, returns = compute_advantages("reinforce++", torch.tensor([2.0, 1.0], dtype=F64), mask)
    assert returns.tolist() == [[2.0, 2.0, 2.0], [1.0, 1.0, 0.0]]


def test_gae_carries_the_next_value_and_the_running_advantage_across_an_observation_span():
    # gamma 0.5, lambda 1; row: policy token 0, observation token 1, policy token 2 with reward 1
    # values [1, 7, 2] (the observation's value is never read):
    #   t=2: delta = 1 + 0.5 * 0 - 2 = -1                  A2 = -1
    #   t=1: masked: the next value stays 2, the running A stays -1
    #   t=0: delta = 0 + 0.5 * 2 - 1 = 0                   A0 = 0 + 0.5 * 1 * (-1) = -0.5
    # returns = (A + V) on policy tokens: [0.5, 0, 1]
    mask = torch.tensor([[1, 0, 1]])
    values = torch.tensor([[1.0, 7.0, 2.0]], dtype=F64)
    _, returns = compute_advantages("gae", torch.tensor([1.0], dtype=F64), mask, values=values, gamma=0.5,
                                    lambd=1.0)
    assert returns.tolist() == [[0.5, 0.0, 1.0]]


def test_gae_values_of_any_shape_but_the_mask_s_are_refused():
    with pytest.raises(ValueError, match=r"^gae needs critic values of shape \(2, 3\), got \(2, 2\)$"):
        compute_advantages("gae", torch.ones(2), torch.ones(2, 3), values=torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"^gae needs critic values of shape \(2, 3\), got None$"):
        compute_advantages("gae", torch.ones(2), torch.ones(2, 3))


def test_gae_computes_half_precision_values_in_float32():
    # gamma = lambda = 1, reward r on the last of two tokens: A1 = r - V1, A0 = V1 - V0 + A1, so the returns
    # A + V are r on both tokens exactly; float32 arithmetic stays within a few roundings of magnitude <= 1 of
    # r = float32(0.1) (float16 arithmetic would round r itself to 0.09998)
    values = torch.tensor([[0.3, 0.7]], dtype=torch.float16)
    _, returns = compute_advantages("gae", torch.tensor([0.1]), torch.ones(1, 2), values=values)
    assert returns.dtype == torch.float32
    assert not bool(returns.isnan().any())
    assert_within(returns, torch.full((1, 2), 0.1, dtype=torch.float32), 8 * unit_roundoff(torch.float32))


def test_whitening_needs_two_tokens_and_works_with_two():
    # [1, 3]: mean 2, unbiased variance 2 -> [-1, 1] / sqrt(2 + 1e-8)
    got = masked_whiten(torch.tensor([[1.0, 3.0, 50.0]], dtype=F64), torch.tensor([[1, 1, 0]]))
    s = math.sqrt(2.0 + 1e-8)
    assert_hand(got[0, :2], [-1 / s, 1 / s])
    with pytest.raises(ValueError, match=r"^whitening needs at least 2 valid tokens in response_mask, got 1$"):
        masked_whiten(torch.tensor([[1.0, 3.0]], dtype=F64), torch.tensor([[1, 0]]))
