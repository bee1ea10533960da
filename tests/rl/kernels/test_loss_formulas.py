"""Every registered policy loss and KL estimator against the kernels' closed-form formulas: value and derivative
w.r.t. the logprob, from rl/core's registry functions under autograd (the oracle). A loss registered without a
kernel formula fails here unless it is listed in UNFUSED_POLICY_LOSSES, which the config then refuses together
with trainer.policy.use_fused_kernels. The torch formulas (rl/kernels/reference/policy_terms.py) always run; the
Triton device functions (rl/kernels/triton/loss_math.py) run under TRITON_INTERPRET=1. The CUDA header
(rl/kernels/cuda/loss_math_device.h) is covered on a GPU by test_kernels_gpu through the fused loss kernel."""

import os

import pytest
import torch

from rl.core.algorithms import KL_ESTIMATORS, POLICY_LOSSES
from rl.core.algorithms.kl import K3_BOUND, K3_LOG_RATIO_BOUND
from rl.core.algorithms.policy_loss import LOG_RATIO_BOUND
from rl.core.config import ConfigError, load_config
from rl.core.config.checks_values import FUSED_KERNEL_POLICY_LOSSES
from rl.kernels.reference.policy_terms import (
    KL_CODES,
    POLICY_CODES,
    UNFUSED_POLICY_LOSSES,
    LossPlan,
    kl_terms,
    policy_terms,
)
from tests.testing.tolerances import EXP_ROUNDINGS, assert_within, formula_gap, unit_roundoff

EPS_LOW, EPS_HIGH, CLIP_C = 0.2, 0.28, 2.5


def _values():
    """Logprobs, old logprobs and advantages on a grid: ratios inside, at and beyond both clip bounds, the log-ratio
    and k3 clamps, both advantage signs and zero."""
    log_ratios = torch.tensor([-30.0, -12.0, -3.0, -0.5, -0.01, 0.0, 0.01, 0.2, 0.5, 3.0, 12.0, 30.0])
    advantages = torch.tensor([-2.0, -0.3, 0.0, 0.7, 1.5])
    lr, adv = torch.meshgrid(log_ratios, advantages, indexing="ij")
    old = torch.linspace(-6.0, -0.1, lr.numel()).reshape(lr.shape)
    return (old + lr).reshape(-1), old.reshape(-1), adv.reshape(-1)


def _plan(policy: str = "regular", kl: str = "k1") -> LossPlan:
    ones = torch.ones(1)
    return LossPlan(weight=ones, metric_weight=ones, token_weight=ones, policy=POLICY_CODES.get(policy, -1),
                    kl=KL_CODES.get(kl, -1), eps_clip_low=EPS_LOW, eps_clip_high=EPS_HIGH, clip_ratio_c=CLIP_C,
                    use_kl=True, kl_coef=1.0, use_entropy=False, entropy_coef=0.0)


def _policy_bounds(name, lp, old, adv):
    """(value, gradient) bounds of two float32 implementations of the policy loss `name`'s per-token formula
    (`formula_gap`): x = logprob - old (one rounding), r = exp(x clamped to +-20) (an exponential, |x| more for its
    argument's rounding), -A r, -A clip(r) and dual clip's -A c (one product each; the clip, max and min pick among
    values each within its bound, which keeps the bound), cispo's product with the logprob (one more); the terms'
    magnitude is |A| max(r, 1 + eps_high, c) (cispo: |A| min(r, 1 + eps_high) |logprob|). The gradient, -A r or
    cispo's -A min(r, 1 + eps_high), or 0 where clipped, jumps where the ratio lies within its bound of a clip edge
    or the clamp."""
    raw = lp.double() - old.double()
    x = raw.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio, adv = x.exp(), adv.double().abs()
    roundings = 3 + EXP_ROUNDINGS + x.abs()
    if name == "cispo":
        weight = ratio.clamp(max=1 + EPS_HIGH)
        value, grad = formula_gap(adv * weight * lp.double().abs(), roundings + 1), formula_gap(adv * weight, roundings)
    else:
        top = torch.tensor(max(1 + EPS_HIGH, CLIP_C), dtype=torch.float64)
        value, grad = formula_gap(adv * torch.maximum(ratio, top), roundings), formula_gap(adv * ratio, roundings)
    u = unit_roundoff(torch.float32)
    near = (raw.abs() - LOG_RATIO_BOUND).abs() <= 2 * u * raw.abs()
    for edge in (1 - EPS_LOW, 1 + EPS_HIGH, CLIP_C):
        near |= (ratio - edge).abs() <= 2 * roundings * u * ratio
    return value, grad + near * adv * ratio


def _kl_bounds(name, lp, ref):
    """(value, gradient) bounds of two float32 implementations of the KL estimator `name` (`formula_gap`), x =
    logprob - ref (one rounding): k1 x and abs |x| within one rounding of |x|, their slopes 1 and sign(x) exact (a
    rounded difference keeps its sign); k2 x^2/2 within three of it, its slope x within one; k3 e^y - y - 1 (y = -x
    clamped to +-20) within an exponential, |y| and three of e^y + |y| + 1, its slope -(e^y - 1) within an
    exponential, |y| and one of e^y + 1; where k3's value is surely above its cap both sides give the cap and slope
    0, where its bound reaches the cap the slope may jump to 0."""
    x = lp.double() - ref.double()
    zero = torch.zeros_like(x)
    if name in ("k1", "abs"):
        return formula_gap(x, 1), zero
    if name == "k2":
        return formula_gap(0.5 * x * x, 3), formula_gap(x, 1)
    y = (-x).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    value = y.exp() - y - 1
    value_gap = formula_gap(y.exp() + y.abs() + 1, EXP_ROUNDINGS + y.abs() + 3)
    grad_gap = formula_gap(y.exp() + 1, EXP_ROUNDINGS + y.abs() + 1)
    capped = value - value_gap > K3_BOUND
    reaches = ~capped & (value + value_gap >= K3_BOUND)
    return (torch.where(capped, zero, value_gap),
            torch.where(capped, zero, grad_gap + reaches * (y.exp() - 1).abs()))


def _core_policy(name, lp, old, adv):
    lp = lp.clone().requires_grad_()
    loss, _ = POLICY_LOSSES.get(name)(lp, old, adv, torch.ones_like(lp, dtype=torch.bool), eps_clip_low=EPS_LOW,
                                      eps_clip_high=EPS_HIGH, clip_ratio_c=CLIP_C,
                                      seq_ids=torch.arange(lp.numel()), num_sequences=lp.numel())
    (grad,) = torch.autograd.grad(loss.sum(), lp)
    return loss.detach(), grad


def _core_kl(name, lp, ref):
    lp = lp.clone().requires_grad_()
    kl = KL_ESTIMATORS.get(name)(lp, ref)
    (grad,) = torch.autograd.grad(kl.sum(), lp)
    return kl.detach(), grad


def test_every_registered_policy_loss_has_a_kernel_formula_or_is_refused():
    for name in POLICY_LOSSES:
        if name in UNFUSED_POLICY_LOSSES:
            assert name not in POLICY_CODES and name not in FUSED_KERNEL_POLICY_LOSSES
            continue
        assert name in POLICY_CODES, (
            f"policy loss '{name}' is registered in POLICY_LOSSES but has no fused-kernel formula: add it to "
            "rl/kernels/reference/policy_terms.py (POLICY_CODES), triton/loss_math.py and cuda/loss_math_device.h, "
            "or list it in UNFUSED_POLICY_LOSSES with the reason"
        )
    assert set(FUSED_KERNEL_POLICY_LOSSES) == set(POLICY_CODES), "checks_values.FUSED_KERNEL_POLICY_LOSSES is stale"
    for name in KL_ESTIMATORS:
        assert name in KL_CODES, (
            f"KL estimator '{name}' is registered in KL_ESTIMATORS but has no fused-kernel formula: add it to "
            "rl/kernels/reference/policy_terms.py (KL_CODES), triton/loss_math.py and cuda/loss_math_device.h"
        )


@pytest.mark.parametrize("name", sorted(UNFUSED_POLICY_LOSSES))
def test_config_refuses_fused_kernels_for_losses_without_a_formula(name):
    import rl.backends.registry  # noqa: F401  (the strategies a config may name)

    with pytest.raises(ConfigError, match=r"trainer\.policy\.use_fused_kernels.*" + name):
        load_config(["trainer.policy.use_fused_kernels=true", f"trainer.algorithm.policy_loss_type={name}"])


@pytest.mark.parametrize("name", sorted(set(POLICY_LOSSES) - set(UNFUSED_POLICY_LOSSES)))
def test_torch_policy_formula_matches_the_registry(name):
    lp, old, adv = _values()
    want, want_grad = _core_policy(name, lp, old, adv)
    got, got_grad, _, _ = policy_terms(_plan(name), lp, old, adv)
    value_gap, grad_gap = _policy_bounds(name, lp, old, adv)
    assert_within(got, want, value_gap, name)
    assert_within(got_grad, want_grad, grad_gap, f"{name} gradient")


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_torch_kl_formula_matches_the_registry(name):
    lp, ref, _ = _values()
    want, want_grad = _core_kl(name, lp, ref)
    got, got_grad = kl_terms(_plan(kl=name), lp, ref)
    value_gap, grad_gap = _kl_bounds(name, lp, ref)
    assert_within(got, want, value_gap, name)
    assert_within(got_grad, want_grad, grad_gap, f"{name} gradient")


INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRETING,
                                       reason="Triton device functions run on CPU only with TRITON_INTERPRET=1")

if INTERPRETING:
    import triton
    import triton.language as tl

    from rl.kernels.triton.loss_math import kl_token, policy_token

    @triton.jit
    def terms_kernel(lp_ptr, old_ptr, adv_ptr, out_ptr, n, eps_low, eps_high, clip_c, POLICY: tl.constexpr,
                     KL: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        on = offs < n
        lp = tl.load(lp_ptr + offs, mask=on, other=0.0)
        old = tl.load(old_ptr + offs, mask=on, other=0.0)
        adv = tl.load(adv_ptr + offs, mask=on, other=0.0)
        pg, d_pg, _, _ = policy_token(lp, old, adv, eps_low, eps_high, clip_c, POLICY)
        kl, d_kl = kl_token(lp, old, KL)
        tl.store(out_ptr + offs * 4 + 0, pg, mask=on)
        tl.store(out_ptr + offs * 4 + 1, d_pg, mask=on)
        tl.store(out_ptr + offs * 4 + 2, kl, mask=on)
        tl.store(out_ptr + offs * 4 + 3, d_kl, mask=on)


def _triton_terms(lp, old, adv, policy: int, kl: int):
    """(policy loss, its grad, kl, its grad) of every element through triton/loss_math.py's device functions."""
    out = torch.empty(lp.numel(), 4)
    terms_kernel[(1,)](lp, old, adv, out, lp.numel(), EPS_LOW, EPS_HIGH, CLIP_C, POLICY=policy, KL=kl,
                       BLOCK=triton.next_power_of_2(lp.numel()))
    return out.unbind(1)


@needs_interpreter
@pytest.mark.parametrize("name", sorted(set(POLICY_LOSSES) - set(UNFUSED_POLICY_LOSSES)))
def test_triton_policy_formula_matches_the_registry(name):
    lp, old, adv = _values()
    want, want_grad = _core_policy(name, lp, old, adv)
    got, got_grad, _, _ = _triton_terms(lp, old, adv, POLICY_CODES[name], 0)
    value_gap, grad_gap = _policy_bounds(name, lp, old, adv)
    assert_within(got, want, value_gap, name)
    assert_within(got_grad, want_grad, grad_gap, f"{name} gradient")


@needs_interpreter
@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_triton_kl_formula_matches_the_registry(name):
    lp, ref, adv = _values()
    want, want_grad = _core_kl(name, lp, ref)
    _, _, got, got_grad = _triton_terms(lp, ref, adv, 0, KL_CODES[name])
    value_gap, grad_gap = _kl_bounds(name, lp, ref)
    assert_within(got, want, value_gap, name)
    assert_within(got_grad, want_grad, grad_gap, f"{name} gradient")
