"""Policy losses at their edges: the metrics every loss reports, defaults, the ratio clamp, band edges, the mask
default and the covariance statistic with a non-zero mean, against hand-computed values."""

import math

import pytest
import torch

from rl.core.algorithms import POLICY_LOSSES
from rl.core.algorithms.policy_loss import LOG_RATIO_BOUND
from tests.testing.tolerances import assert_within, gamma

F64 = torch.float64
CLIP = {"eps_clip_low": 0.2, "eps_clip_high": 0.3}


def assert_hand(got, want, ops=16, scale=None):
    """float64 both sides within 2 * gamma_ops of the magnitudes met (`scale`, default |want|); NaN never passes."""
    want = torch.as_tensor(want, dtype=F64)
    assert not bool(torch.isnan(got).any()), f"NaN in {got}"
    scale = want.abs() if scale is None else torch.as_tensor(scale, dtype=F64)
    assert_within(got, want, 2 * gamma(ops, F64) * scale)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_loss_reports_ppo_kl_as_old_minus_new(name):
    # dyadic logprobs: old - logp is exact
    logp = torch.tensor([[-0.5, -1.25, -2.0, -0.75]], dtype=F64)
    old = torch.tensor([[-0.75, -1.0, -2.0, -0.5]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0, 0.5, -0.5]], dtype=F64)
    _, metrics = POLICY_LOSSES.get(name)(logp, old, adv, torch.ones(1, 4, dtype=torch.bool), **CLIP)
    assert metrics["ppo_kl"].tolist() == [[-0.25, 0.25, 0.0, 0.25]]


def test_dual_clip_defaults_to_a_cap_of_three():
    # A = -1, r = 5: regular gives max(5, 1.3) = 5, capped at -A * 3 = 3
    loss, metrics = POLICY_LOSSES.get("dual_clip")(
        torch.tensor([math.log(5.0)], dtype=F64), torch.zeros(1, dtype=F64), -torch.ones(1, dtype=F64), None, **CLIP
    )
    assert_hand(loss, [3.0])
    assert metrics["pg_clipfrac_lower"].tolist() == [1.0]


def test_dual_clip_accepts_any_cap_above_one():
    # cap 1.5 with A = -2, r = 1 (logp = old): loss 2 is below the cap 3
    loss, _ = POLICY_LOSSES.get("dual_clip")(
        torch.zeros(1, dtype=F64), torch.zeros(1, dtype=F64), torch.tensor([-2.0], dtype=F64), None, **CLIP,
        clip_ratio_c=1.5,
    )
    assert loss.tolist() == [2.0]


def test_dual_clip_at_exactly_the_cap_changes_nothing():
    # A = -1, clip range [0.8, 2], cap 2: r = 1 -> loss 1 (below the cap); r = 4 -> max(4, 2) = 4, lowered to 2;
    # r = 2 -> max(2, 2) = 2, exactly the cap: not lowered
    logp = torch.tensor([1.0, 4.0, 2.0], dtype=F64).log()
    assert torch.exp(logp[2]).item() == 2.0  # exp(log 2) is exact in float64, which the edge relies on
    loss, metrics = POLICY_LOSSES.get("dual_clip")(
        logp, torch.zeros(3, dtype=F64), -torch.ones(3, dtype=F64), None, eps_clip_low=0.2, eps_clip_high=1.0,
        clip_ratio_c=2.0,
    )
    assert_hand(loss, [1.0, 2.0, 2.0])
    assert metrics["pg_clipfrac_lower"].tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("name", ["regular", "dual_clip", "cispo", "sapo", "rollout_is"])
def test_the_log_ratio_is_clamped_to_twenty_both_ways(name):
    # logp - old = 25, -25, inf, -inf gives the loss of logp - old = 20, -20, 20, -20: r never exp(+-25), inf, 0
    logp = torch.full((4,), -1.0, dtype=F64)
    old = logp - torch.tensor([25.0, -25.0, math.inf, -math.inf], dtype=F64)
    at_bound = logp - torch.tensor([20.0, -20.0, 20.0, -20.0], dtype=F64)
    adv = torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=F64)
    got, _ = POLICY_LOSSES.get(name)(logp, old, adv, None, **CLIP)
    want, _ = POLICY_LOSSES.get(name)(logp, at_bound, adv, None, **CLIP)
    assert torch.equal(got, want) and LOG_RATIO_BOUND == 20.0


def test_cispo_flags_only_ratios_above_the_upper_bound():
    # r = [1, 0.5, 2, 0.9], A = 1, weight min(r, 1 + eps_clip_high), loss -weight * logp
    logp = torch.tensor([1.0, 0.5, 2.0, 0.9], dtype=F64).log()
    zeros, ones = torch.zeros(4, dtype=F64), torch.ones(4, dtype=F64)
    # eps_clip_high 0: r = 1 sits on the bound and is not clipped
    loss, metrics = POLICY_LOSSES.get("cispo")(logp, zeros, ones, None, eps_clip_low=0.2, eps_clip_high=0.0)
    assert metrics["pg_clipfrac"].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert_hand(loss, -torch.tensor([0.0, 0.5, 1.0, 0.9], dtype=F64) * logp)
    # eps_clip_high 0.3: only r = 2 is above 1.3; r = 0.5 and 0.9 below 1 are never clipped by cispo
    loss, metrics = POLICY_LOSSES.get("cispo")(logp, zeros, ones, None, eps_clip_low=0.2, eps_clip_high=0.3)
    assert metrics["pg_clipfrac"].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert_hand(loss, -torch.tensor([1.0, 0.5, 1.3, 0.9], dtype=F64) * logp)


def test_rollout_is_band_is_open():
    # a zero-width side puts r = 1 on the band's edge, outside it: weight 0 (SkyRL: 1 - low < r < 1 + high)
    logp = torch.tensor([0.0, -0.5], dtype=F64)
    adv = torch.ones(2, dtype=F64)
    for low, high in ((0.0, 0.3), (0.2, 0.0)):
        loss, metrics = POLICY_LOSSES.get("rollout_is")(logp, logp.clone(), adv, None, eps_clip_low=low,
                                                         eps_clip_high=high)
        assert loss.tolist() == [0.0, 0.0] and metrics["pg_clipfrac"].tolist() == [1.0, 1.0]
    loss, metrics = POLICY_LOSSES.get("rollout_is")(logp, logp.clone(), adv, None, **CLIP)
    assert loss.tolist() == [0.0, 0.5] and metrics["pg_clipfrac"].tolist() == [0.0, 0.0]


def test_importance_sampling_ratio_is_new_over_old():
    # r = exp(logp - old) with old != 0: exp(-1 - (-1.5)) = exp(0.5), exp(-3 - (-1)) = exp(-2)
    logp = torch.tensor([-1.0, -3.0], dtype=F64, requires_grad=True)
    old = torch.tensor([-1.5, -1.0], dtype=F64)
    adv = torch.tensor([2.0, -1.0], dtype=F64)
    loss, metrics = POLICY_LOSSES.get("importance_sampling")(logp, old, adv, None, **CLIP)
    r = [math.exp(0.5), math.exp(-2.0)]
    assert_hand(loss, [-2.0 * r[0], r[1]])
    assert_hand(metrics["importance_ratio"], r)


def test_sapo_default_temperatures():
    # tau_pos 1 (A > 0), tau_neg 1.05 (A < 0) at r = 2: f = sigmoid(tau) * 4 / tau, loss -f A
    logp = torch.tensor([math.log(2.0), math.log(2.0)], dtype=F64)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    loss, _ = POLICY_LOSSES.get("sapo")(logp, torch.zeros(2, dtype=F64), adv, None, **CLIP)

    def gate(tau):
        return 4.0 / tau / (1.0 + math.exp(-tau))

    assert_hand(loss, [-gate(1.0), gate(1.05)], scale=4.0)


@pytest.mark.parametrize("name", ["gspo", "clip_cov", "kl_cov"])
def test_no_mask_means_every_token(name):
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-1.0, -0.25, -3.0]], dtype=F64)
    old = torch.tensor([[-0.75, -1.0, -1.5], [-1.0, -0.5, -3.0]], dtype=F64)
    adv = torch.tensor([[3.0, 3.0, 3.0], [-1.0, -1.0, -1.0]], dtype=F64)
    options = {"kl_cov_frac": 0.5} if name == "kl_cov" else {}
    torch.manual_seed(0)
    loss, metrics = POLICY_LOSSES.get(name)(logp, old, adv, None, **CLIP, **options)
    torch.manual_seed(0)
    want, want_metrics = POLICY_LOSSES.get(name)(logp, old, adv, torch.ones(2, 3, dtype=torch.bool), **CLIP,
                                                 **options)
    assert torch.equal(loss, want)
    assert all(torch.equal(metrics[k], want_metrics[k]) for k in want_metrics)


def covariance_inputs():
    # masked means A 2 and logp -1 (the fourth token is padding); cov = (A - 2) (logp + 1) = [2, 0, 6]:
    #   token 0: A 4, logp 0     -> 2 * 1 = 2
    #   token 1: A 2, logp 1     -> 0 * 2 = 0
    #   token 2: A 0, logp -4    -> -2 * -3 = 6
    # (centred on the raw A instead, (A + 2) (logp + 1) = [6, 8, -6] would rank the tokens otherwise)
    logp = torch.tensor([0.0, 1.0, -4.0, 9.0], dtype=F64)
    adv = torch.tensor([4.0, 2.0, 0.0, -50.0], dtype=F64)
    mask = torch.tensor([True, True, True, False])
    return logp, adv, mask


def test_kl_cov_centres_the_covariance_on_the_masked_means():
    # kl_cov_frac 1/3 of 3 tokens: the one of largest covariance, token 2 (6), gets ppo_kl_coef * |logp - old|
    logp, adv, mask = covariance_inputs()
    old = logp - 0.5
    loss, metrics = POLICY_LOSSES.get("kl_cov")(logp, old, adv, mask, **CLIP, kl_cov_frac=1 / 3, ppo_kl_coef=2.0)
    e = math.exp(0.5)
    assert_hand(loss[mask], [-4.0 * e, -2.0 * e, 1.0], scale=8.0)
    assert metrics["kl_cov_frac"].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert metrics["kl_cov_frac"].dtype == F64


def test_kl_cov_defaults():
    # kl_cov_frac 0.2 of 5 tokens: one token (the largest covariance), ppo_kl_coef 1
    logp = torch.tensor([1.0, -4.0, 0.0, -1.0, -1.0], dtype=F64)
    adv = torch.tensor([4.0, 2.0, 0.0, 2.0, 2.0], dtype=F64)
    old = logp + 0.25
    loss, metrics = POLICY_LOSSES.get("kl_cov")(logp, old, adv, None, **CLIP)
    e = math.exp(-0.25)
    assert metrics["kl_cov_frac"].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert_hand(loss, [-4.0 * e + 0.25, -2.0 * e, 0.0, -2.0 * e, -2.0 * e], scale=6.0)


def test_clip_cov_centres_the_covariance_and_keeps_the_lower_bound_open():
    # ratio 1 (loss -A): band (lb, 5) with lb = 2 excludes token 0 (covariance exactly 2); lb = 1.5 takes it;
    # token 2 (6) is above the band either way
    logp, adv, mask = covariance_inputs()
    for lb, cut in ((2.0, [0.0, 0.0, 0.0]), (1.5, [1.0, 0.0, 0.0])):
        loss, metrics = POLICY_LOSSES.get("clip_cov")(logp, logp.clone(), adv, mask, **CLIP, clip_cov_ratio=1.0,
                                                      clip_cov_lb=lb, clip_cov_ub=5.0)
        assert metrics["clip_cov_frac"][mask].tolist() == cut
        assert loss[mask].tolist() == [0.0 if cut[0] else -4.0, -2.0, 0.0]
        assert metrics["clip_cov_frac"].dtype == F64


def clip_cov_default_inputs():
    # means A 0 and logp -1 over four tokens; cov = A (logp + 1) = [2, 5.5, -0.9, 2]: tokens 0 and 3 lie in the
    # default band (1, 5), token 1 above it
    logp = torch.tensor([0.0, -2.1, -1.9, 0.0], dtype=F64)
    adv = torch.tensor([2.0, -5.0, 1.0, 2.0], dtype=F64)
    return logp, adv


def test_clip_cov_default_band():
    logp, adv = clip_cov_default_inputs()
    _, metrics = POLICY_LOSSES.get("clip_cov")(logp, logp.clone(), adv, None, **CLIP, clip_cov_ratio=1.0)
    assert metrics["clip_cov_frac"].tolist() == [1.0, 0.0, 0.0, 1.0]


def test_clip_cov_default_ratio_cuts_one_token():
    # clip_cov_ratio 0.0002: max(1, int(0.0002 * 4)) = one of the two candidates
    logp, adv = clip_cov_default_inputs()
    torch.manual_seed(0)
    _, metrics = POLICY_LOSSES.get("clip_cov")(logp, logp.clone(), adv, None, **CLIP)
    cut = metrics["clip_cov_frac"].tolist()
    assert sum(cut) == 1.0 and cut[0] + cut[3] == 1.0


def test_covariance_of_a_single_loss_token_is_zero():
    # one masked token: its value is the mean, so the covariance is 0 and no band above 0 selects it
    logp = torch.tensor([-2.0, 5.0], dtype=F64)
    adv = torch.tensor([-4.0, 9.0], dtype=F64)
    mask = torch.tensor([True, False])
    loss, metrics = POLICY_LOSSES.get("clip_cov")(logp, logp.clone(), adv, mask, **CLIP, clip_cov_ratio=1.0,
                                                  clip_cov_lb=-1.0, clip_cov_ub=0.5)
    assert metrics["clip_cov_frac"].tolist() == [1.0, 0.0]  # covariance 0 lies in (-1, 0.5)
    loss, metrics = POLICY_LOSSES.get("clip_cov")(logp, logp.clone(), adv, mask, **CLIP, clip_cov_ratio=1.0,
                                                  clip_cov_lb=0.5, clip_cov_ub=5.0)
    assert metrics["clip_cov_frac"].tolist() == [0.0, 0.0] and loss[0].item() == 4.0
