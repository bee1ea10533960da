"""The KL penalty in the reward: the controllers' coefficient against a hand-computed trajectory, their checkpoint
state, and the penalized token rewards and mean KL against hand-computed values."""

import math
from types import SimpleNamespace

import pytest
import torch

from rl.core.algorithms.kl_controller import (
    AdaptiveKLController,
    FixedKLController,
    kl_controller,
    kl_penalized_token_rewards,
)
from tests.testing.tolerances import assert_within, gamma

F64 = torch.float64


def assert_close_hand(got: float, want: float, ops: int, scale: float | None = None) -> None:
    """Both sides in float64, each within gamma_ops (Higham) of the exact value relative to the magnitudes met
    (`scale`: the sum of |terms| where terms cancel; |want| otherwise)."""
    bound = 2 * gamma(ops, F64) * (abs(want) if scale is None else scale)
    assert_within(torch.tensor(got, dtype=F64), torch.tensor(want, dtype=F64), bound)


def test_adaptive_coefficient_moves_towards_the_target_by_hand():
    # beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon, target 1, horizon 10, start 0.1
    # kl 1.5, n 2:  error 0.5 -> 0.2,   x 1.04  -> 0.104       (above target: beta grows)
    # kl 1.1, n 5:  error 0.1,          x 1.05  -> 0.1092
    # kl 0.5, n 10: error -0.5 -> -0.2, x 0.8   -> 0.08736     (below target: beta shrinks)
    # kl 0.9, n 4:  error -0.1,         x 0.96  -> 0.0838656
    # kl 1.0, n 3:  error 0,            x 1     -> 0.0838656
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=10)
    steps = [(1.5, 2, 0.104), (1.1, 5, 0.1092), (0.5, 10, 0.08736), (0.9, 4, 0.0838656), (1.0, 3, 0.0838656)]
    for i, (kl, n, want) in enumerate(steps, start=1):
        ctrl.update(kl, n)
        assert_close_hand(ctrl.value, want, ops=6 * i)  # per update: a division, a subtraction, a clip, three ops


def test_fixed_coefficient_never_moves():
    ctrl = FixedKLController(kl_coef=0.05)
    for kl in (0.0, 10.0, 1e-6):
        ctrl.update(kl, 64)
    assert ctrl.value == 0.05


@pytest.mark.parametrize("make", [lambda: FixedKLController(0.3), lambda: AdaptiveKLController(0.3, 0.1, 100)])
def test_state_dict_round_trip(make):
    ctrl = make()
    ctrl.update(0.5, 8)
    resumed = make()
    resumed.load_state_dict(ctrl.state_dict())
    assert resumed.value == ctrl.value
    ctrl.update(0.01, 8)
    resumed.update(0.01, 8)
    assert resumed.value == ctrl.value


def _algorithm(kind, coef=0.02, target=0.5, horizon=50):
    return SimpleNamespace(kl_loss_coef=coef, kl_ctrl=SimpleNamespace(type=kind, kl_target=target, horizon=horizon))


def test_factory_starts_at_kl_loss_coef():
    fixed, adaptive = kl_controller(_algorithm("fixed")), kl_controller(_algorithm("adaptive"))
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.02
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.02
    assert (adaptive.target, adaptive.horizon) == (0.5, 50)


@pytest.mark.parametrize(
    ("algorithm", "key"),
    [
        (_algorithm("adaptve"), "kl_ctrl.type"),
        (_algorithm("adaptive", horizon=0), "kl_ctrl.horizon"),
        (_algorithm("adaptive", target=0.0), "kl_ctrl.kl_target"),
    ],
)
def test_factory_errors_name_the_key(algorithm, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        kl_controller(algorithm)


def test_penalized_token_rewards_by_hand():
    # k1 = logp - ref: row 0 [0.5, -1, 0], row 1 [0.5, 0, masked (its ref is NaN: nothing leaks)]
    # beta 0.1: rewards [[0, 0, 1], [0, 2, 0]] - 0.1 * kl -> [[-0.05, 0.1, 1], [-0.05, 2, 0]]
    # mean kl per sequence: row 0 -0.5 / 3, row 1 0.5 / 2 -> their mean (-1/6 + 1/4) / 2 = 1/24
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, 0.0]], dtype=F64)
    ref = torch.tensor([[-1.5, -1.0, -3.0], [-1.0, -1.0, math.nan]], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=F64)
    penalized, mean_kl = kl_penalized_token_rewards(rewards, logp, ref, mask, beta=0.1, kl_estimator="k1")
    want = torch.tensor([[-0.05, 0.1, 1.0], [-0.05, 2.0, 0.0]], dtype=F64)
    assert_within(penalized, want, 2 * gamma(2, F64) * want.abs().max())
    assert_close_hand(mean_kl, 1 / 24, ops=8, scale=1.0)  # per-row sums of |kl| <= 1.5, divided by 3 and 2


def test_penalty_uses_the_named_estimator():
    # k3 at logp - ref = 0.5: exp(-0.5) + 0.5 - 1; one token, beta 2
    logp, ref = torch.tensor([[0.0]], dtype=F64), torch.tensor([[-0.5]], dtype=F64)
    k3 = math.exp(-0.5) - 0.5
    penalized, mean_kl = kl_penalized_token_rewards(
        torch.zeros(1, 1, dtype=F64), logp, ref, torch.ones(1, 1, dtype=torch.bool), beta=2.0, kl_estimator="k3"
    )
    terms = math.exp(-0.5) + 0.5 + 1  # k3's terms cancel down to ~0.11
    assert_close_hand(float(penalized), -2 * k3, ops=8, scale=2 * terms)
    assert_close_hand(mean_kl, k3, ops=8, scale=terms)
