"""`rollout_is`'s band, token by token against hand-computed values: a token's ratio r = exp(logp - old) weighs
its policy gradient only strictly inside (1 - eps_clip_low, 1 + eps_clip_high) (SkyRL's `rollout_is_policy_loss`:
`in_range = (ratio > 1 - eps_clip_low) & (ratio < 1 + eps_clip_high)`, loss -sg(in_range ? r : 0) * A * logp).

The sides differ (0.25 and 0.5, exact in binary), and ratios sit at, just inside and just outside each edge and
between 1 - eps_clip_high and 1 - eps_clip_low and between 1 + eps_clip_low and 1 + eps_clip_high, where a band
with its sides swapped, or one side used for both, answers otherwise."""

import math

import pytest
import torch

from rl.core.algorithms import POLICY_LOSSES
from tests.testing.tolerances import assert_within, gamma

F64 = torch.float64
LOW, HIGH = 0.25, 0.5  # band (0.75, 1.5); swapped it would be (0.5, 1.25)
BELOW, ABOVE = 1 - LOW, 1 + HIGH


def _down(x: float) -> float:
    return math.nextafter(x, -math.inf)


def _up(x: float) -> float:
    return math.nextafter(x, math.inf)


# (ratio, inside the band): each a float64 the loss's exp(logp - 0) yields exactly (`_logprob_of`)
RATIOS = [
    (0.4, False),  # below both 1 - HIGH and 1 - LOW
    (0.5, False),  # 1 - HIGH: the swapped band's open lower edge
    (0.625, False),  # between 1 - HIGH and 1 - LOW: inside the swapped band only
    (_down(BELOW), False),
    (BELOW, False),  # 1 - LOW: the open lower edge
    (_up(BELOW), True),
    (0.875, True),
    (1.0, True),
    (1.25, True),  # 1 + LOW: the swapped band's open upper edge
    (1.375, True),  # between 1 + LOW and 1 + HIGH: outside the swapped band
    (_down(ABOVE), True),
    (ABOVE, False),  # 1 + HIGH: the open upper edge
    (_up(ABOVE), False),
    (2.0, False),
]
ADVANTAGES = [1.0, -2.0, 0.5, -1.0, 3.0, -0.5, 2.0, 1.5, -3.0, 0.75, 1.0, -1.0, 2.0, -2.0]


def _logprob_of(ratio: float) -> float:
    """A float64 logp whose torch.exp is `ratio` exactly (log's nearest float64, or one of its neighbours: exp's
    slope is r, so near log r consecutive logps land less than an ulp of r apart)."""
    x = math.log(ratio)
    for _ in range(64):
        got = float(torch.exp(torch.tensor(x, dtype=F64)))
        if got == ratio:
            return x
        x = math.nextafter(x, math.inf if got < ratio else -math.inf)
    raise AssertionError(f"no float64 logp with exp(logp) == {ratio!r}")


def test_rollout_is_weighs_only_ratios_strictly_inside_its_band():
    logp = torch.tensor([_logprob_of(r) for r, _ in RATIOS], dtype=F64, requires_grad=True)
    adv = torch.tensor(ADVANTAGES, dtype=F64)
    assert torch.equal(torch.exp(logp.detach()), torch.tensor([r for r, _ in RATIOS], dtype=F64))
    loss, metrics = POLICY_LOSSES.get("rollout_is")(logp, torch.zeros_like(logp), adv, None, eps_clip_low=LOW,
                                                     eps_clip_high=HIGH)
    weight = [r if inside else 0.0 for r, inside in RATIOS]
    assert metrics["pg_clipfrac"].tolist() == [0.0 if inside else 1.0 for _, inside in RATIOS]
    # loss -w A logp and its gradient -w A (w held constant): products of two and three float64 numbers
    want = torch.tensor([-w * a * x for w, a, x in zip(weight, ADVANTAGES, logp.tolist(), strict=True)], dtype=F64)
    assert_within(loss, want, 2 * gamma(3, F64) * want.abs(), msg="rollout_is loss per token")
    loss.sum().backward()
    want_grad = torch.tensor([-w * a for w, a in zip(weight, ADVANTAGES, strict=True)], dtype=F64)
    assert_within(logp.grad, want_grad, 2 * gamma(2, F64) * want_grad.abs(), msg="rollout_is gradient per token")


@pytest.mark.parametrize(("low", "high"), [(LOW, HIGH), (HIGH, LOW)])
def test_each_side_of_the_band_is_its_own_setting(low, high):
    # the same tokens under the band and its mirror: the side that moved takes its tokens with it
    logp = torch.tensor([_logprob_of(r) for r, _ in RATIOS], dtype=F64)
    _, metrics = POLICY_LOSSES.get("rollout_is")(logp, torch.zeros_like(logp), torch.ones_like(logp), None,
                                                 eps_clip_low=low, eps_clip_high=high)
    inside = [1 - low < r < 1 + high for r, _ in RATIOS]
    assert metrics["pg_clipfrac"].tolist() == [0.0 if i else 1.0 for i in inside]
