"""KL estimators against hand-computed values."""

import math

import pytest
import torch

from rl.core.algorithms import KL_ESTIMATORS, compute_kl

LOGP = torch.tensor([-1.0, -2.0], dtype=torch.float64)
REF = torch.tensor([-1.5, -1.0], dtype=torch.float64)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("k1", [0.5, -1.0]),  # logp - ref
        ("abs", [0.5, 1.0]),  # |logp - ref|
        ("k2", [0.125, 0.5]),  # 0.5 * (logp - ref)^2
        # ref - logp = [-0.5, 1]: exp(-0.5) + 0.5 - 1 and exp(1) - 1 - 1
        ("k3", [math.exp(-0.5) - 0.5, math.e - 2.0]),
    ],
)
def test_hand_computed(name, expected):
    torch.testing.assert_close(compute_kl(name, LOGP, REF), torch.tensor(expected, dtype=torch.float64))


def test_k3_is_clamped_to_ten():
    # ref - logp = -30 -> clamp to -20 -> exp(-20) + 19 > 10;  ref - logp = 30 -> exp(20) - 21 > 10
    kl = compute_kl("k3", torch.tensor([0.0, -30.0]), torch.tensor([-30.0, 0.0]))
    torch.testing.assert_close(kl, torch.tensor([10.0, 10.0]))


def test_k3_gradient():
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp)
    logp = LOGP.clone().requires_grad_(True)
    compute_kl("k3", logp, REF).sum().backward()
    torch.testing.assert_close(logp.grad, 1 - torch.exp(REF - LOGP))


def test_unknown_name_lists_choices():
    with pytest.raises(KeyError, match="k1, k2, k3"):
        KL_ESTIMATORS.get("k4")
