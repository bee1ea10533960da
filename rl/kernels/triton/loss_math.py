"""Per-token loss formulas and their derivatives as Triton device functions.

A line-by-line mirror of rl/kernels/reference/policy_terms.py (the oracle): POLICY 0 regular, 1 dual_clip,
2 cispo; KL 0 k1, 1 abs, 2 k2, 3 k3. Bounds are those of rl/core (log ratio +-20, k3 result +-10).
"""

import triton
import triton.language as tl

LOG_RATIO_BOUND = tl.constexpr(20.0)
K3_BOUND = tl.constexpr(10.0)


@triton.jit
def _within(x, low, high):
    return ((x >= low) & (x <= high)).to(tl.float32)


@triton.jit
def policy_token(lp, old, adv, eps_low, eps_high, clip_c, POLICY: tl.constexpr):
    """(loss, d loss / d lp, clipped flag, lower-clip flag) of one token."""
    log_ratio = lp - old
    ratio = tl.exp(tl.minimum(tl.maximum(log_ratio, -LOG_RATIO_BOUND), LOG_RATIO_BOUND))
    d_ratio = ratio * _within(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    low = 1.0 - eps_low
    high = 1.0 + eps_high
    if POLICY == 2:
        weight = tl.minimum(ratio, high)
        loss = -weight * adv * lp
        grad = -weight * adv
        clip = (ratio > high).to(tl.float32)
        lower = clip * 0.0
    else:
        unclipped = -adv * ratio
        clipped = -adv * tl.minimum(tl.maximum(ratio, low), high)
        loss = tl.maximum(unclipped, clipped)
        d_un = -adv * d_ratio
        d_cl = -adv * d_ratio * _within(ratio, low, high)
        grad = tl.where(unclipped > clipped, d_un, tl.where(unclipped < clipped, d_cl, 0.5 * (d_un + d_cl)))
        clip = (clipped > unclipped).to(tl.float32)
        lower = clip * 0.0
        if POLICY == 1:
            cap = -adv * clip_c
            negative = adv < 0
            lower = (negative & (loss > cap)).to(tl.float32)
            capped = tl.where(loss < cap, grad, tl.where(loss > cap, 0.0, 0.5 * grad))
            grad = tl.where(negative, capped, grad)
            loss = tl.where(negative, tl.minimum(loss, cap), loss)
    return loss, grad, clip, lower


@triton.jit
def kl_token(lp, ref, KL: tl.constexpr):
    """(KL estimate, d / d lp) of one token."""
    diff = lp - ref
    if KL == 0:
        value = diff
        grad = diff * 0.0 + 1.0
    elif KL == 1:
        value = tl.abs(diff)
        grad = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
    elif KL == 2:
        value = 0.5 * diff * diff
        grad = diff
    else:
        x = -diff
        xc = tl.minimum(tl.maximum(x, -LOG_RATIO_BOUND), LOG_RATIO_BOUND)
        ex = tl.exp(xc)
        raw = ex - xc - 1.0
        grad = -(ex - 1.0) * _within(x, -LOG_RATIO_BOUND, LOG_RATIO_BOUND) * _within(raw, -K3_BOUND, K3_BOUND)
        value = tl.minimum(tl.maximum(raw, -K3_BOUND), K3_BOUND)
    return value, grad
