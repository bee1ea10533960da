"""Edges of the small pure helpers, by hand: the adaptive KL controller with a target other than 1, a batch without
sequences, a decay over a single step, DAPO's overlong ramp over a one-token band, and k3 at a zero-probability
token."""

import math

import torch

from rl.core.algorithms.kl import kl_k3
from rl.core.algorithms.kl_controller import AdaptiveKLController, kl_penalized_token_rewards
from rl.core.algorithms.lr_schedule import lr_factor
from rl.core.algorithms.reward_shaping import groups_with_signal, overlong_penalty


def test_adaptive_controller_divides_by_the_target():
    # kl 0.55 against target 0.5: error 0.55 / 0.5 - 1 = 0.1; beta *= 1 + 0.1 * 2 sequences / horizon 1
    ctrl = AdaptiveKLController(0.25, 0.5, horizon=1)
    ctrl.update(0.55, n_steps=2)
    assert math.isclose(ctrl.value, 0.25 * 1.2, rel_tol=1e-15)


def test_kl_penalty_of_an_empty_batch():
    empty = torch.zeros(0, 3)
    rewards, mean_kl = kl_penalized_token_rewards(empty, empty, empty, empty.bool(), 0.1, "k1")
    assert rewards.shape == (0, 3) and mean_kl == 0.0


def test_a_decay_over_one_step_reaches_its_floor_at_once():
    for scheduler in ("linear", "cosine"):
        assert lr_factor(0, 0, scheduler, decay_steps=1, min_ratio=0.25) == 1.0
        assert lr_factor(1, 0, scheduler, decay_steps=1, min_ratio=0.25) == 0.25
        assert lr_factor(3, 2, scheduler, decay_steps=3, min_ratio=0.0) == 0.0


def test_groups_of_one_all_count_as_a_bool_mask():
    flags = groups_with_signal(torch.tensor([1.0, 1.0, 0.0]), 1)
    assert flags.dtype == torch.bool and flags.tolist() == [True, True, True]


def test_overlong_ramp_over_a_one_token_band():
    # max_length 10, band 1: nothing up to 9 tokens, -factor from 10 on (beyond max_length too: the ramp is capped)
    got = overlong_penalty(torch.tensor([8, 9, 10, 12]), max_length=10, band=1, factor=0.5)
    assert got.tolist() == [0.0, 0.0, -0.5, -0.5] and got.dtype == torch.float32
    assert overlong_penalty(torch.tensor([12]), max_length=10, band=0, factor=0.5).tolist() == [0.0]


def test_k3_at_a_token_the_policy_gives_probability_zero():
    # log pi = -inf: the log ratio is clamped to 20 before exp, so the estimate is its cap 10, not NaN (inf - inf)
    got = kl_k3(torch.tensor([-math.inf, -1.0]), torch.tensor([-1.0, -1.0]))
    assert got.tolist() == [10.0, 0.0]
