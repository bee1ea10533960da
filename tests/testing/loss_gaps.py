"""Bounds on the gap between two float computations of the policy-loss formulas (log-softmax over the vocabulary and
its gradient, each policy loss's surrogate and KL terms): `tests.testing.tolerances`' rule applied term by term."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tests.testing.tolerances import network_rtol, rounded_gap


def _softmax_parts(logits: torch.Tensor, temperature: float):
    z = logits.detach().double() / temperature
    logp = torch.log_softmax(z, -1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    return z, logp, p, entropy


def log_softmax_gaps(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                     logit_gap: float | torch.Tensor = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row gaps of two float32 computations of a token's log-probability log p_t = z_t/T - logsumexp(z/T) and of
    the entropy H = logsumexp(z/T) - sum_j p_j z_j/T from `logits` [N, V] (either side's), when the two sides' logits
    differ by at most `logit_gap` per element (0: the same logits; `matmul_gap` for logits each side computes):
    - each side reduces over the vocabulary twice (the normaliser, the entropy's weighted sum; a blocked or
      vocabulary-parallel pass rescales its partial sums, fewer roundings than the vocabulary's) in its own order,
      relative to the row's scale 1 + max|z/T| plus the value for the exp's and log's own roundings:
      `network_rtol([V, V])` of that;
    - logits that differ by at most g_j move log p_t by <= g_t/T + D, D = max_j g_j / T (logsumexp is 1-Lipschitz in
      the max norm), and H by <= 2 log(V) D (|dH/dz|_1 = sum_j p_j |log p_j + H| / T <= 2H / T <= 2 log(V) / T).
    Returns (logprob gap [N], entropy gap [N]), float64."""
    z, logp, _, entropy = _softmax_parts(logits, temperature)
    lp = logp.gather(1, targets.long()[:, None]).squeeze(1)
    rtol = network_rtol([z.shape[-1]] * 2, torch.float32)
    rows = 1 + z.abs().amax(-1)
    shift = torch.as_tensor(logit_gap, dtype=torch.float64, device=z.device).expand_as(z) / temperature
    d = shift.amax(-1)
    lp_gap = rtol * (rows + lp.abs()) + shift.gather(1, targets.long()[:, None]).squeeze(1) + d
    h_gap = rtol * (rows + entropy) + 2 * math.log(z.shape[-1]) * d
    return lp_gap, h_gap


def log_softmax_grad_gap(logits: torch.Tensor, targets: torch.Tensor, w1: torch.Tensor | None,
                         w2: torch.Tensor | None, temperature: float = 1.0, reductions: Sequence[int] | None = None,
                         logit_gap: float | torch.Tensor = 0.0, w1_gap: float | torch.Tensor = 0.0,
                         dtype: torch.dtype = torch.float32, grad: torch.Tensor | None = None) -> torch.Tensor:
    """Per-element gap [N, V] of two computations of the gradient of sum_t (w1_t log p_t + w2_t H_t) w.r.t. the
    logits, G_j = (w1 (1[j = t] - p_j) - w2 p_j (log p_j + H)) / T per row (w1, w2: [N], None for a term left out):
    - each side's own float32 arithmetic: `network_rtol(reductions)` (default: the vocabulary twice, as in
      `log_softmax_gaps`) relative to the terms' magnitude (|w1| (1[j=t] + p_j) + |w2| p_j (|log p_j| + H)) / T
      times the row's scale 1 + max|z/T| (each p_j carries its row's rounding relative to the logits);
    - logits that differ by at most g (D = max_j g_j / T per row): p_j moves by <= p_j E, E = e^(2D) - 1, log p_j by
      <= 2D and H by <= 2 log(V) D (`log_softmax_gaps`), so by the product rule G_j by
      <= (|w1| p_j E + |w2| p_j (E (|log p_j| + H) + e^(2D) 2D (1 + log V))) / T;
    - weights w1 that differ by at most `w1_gap` (a loss's slope at the two sides' logprobs, `policy_loss_gaps`):
      w1_gap (1[j=t] + p_j) / T;
    - a gradient stored in a lower `dtype` rounds once more on each side (`rounded_gap` of `grad`)."""
    z, logp, p, entropy = _softmax_parts(logits, temperature)
    rows, vocab = z.shape
    zero = torch.zeros(rows, dtype=torch.float64, device=z.device)
    w1 = zero if w1 is None else w1.detach().double().abs()
    w2 = zero if w2 is None else w2.detach().double().abs()
    w1, w2, h = w1[:, None], w2[:, None], entropy[:, None]
    onehot = torch.zeros_like(z).scatter_(1, targets.long()[:, None], 1.0)
    terms = (w1 * (onehot + p) + w2 * p * (logp.abs() + h)) / temperature
    rtol = network_rtol([vocab, vocab] if reductions is None else reductions, torch.float32)
    gap = rtol * terms * (1 + z.abs().amax(-1, keepdim=True))
    as_gap = lambda x: torch.as_tensor(x, dtype=torch.float64, device=z.device)  # noqa: E731
    d = (as_gap(logit_gap).expand_as(z) / temperature).amax(-1, keepdim=True)
    grow = torch.expm1(2 * d)
    gap = gap + (w1 * p * grow + w2 * p * (grow * (logp.abs() + h) + (1 + grow) * 2 * d * (1 + math.log(vocab))))
    gap = gap + as_gap(w1_gap).expand(rows)[:, None] * (onehot + p) / temperature
    if dtype == torch.float32 or dtype == torch.float64:
        return gap
    assert grad is not None, "a gradient stored in a lower precision rounds: pass it as `grad`"
    return rounded_gap(grad.detach().double(), gap, dtype)


def _surrogate(policy: str, adv: torch.Tensor, ratio: torch.Tensor, logprob: torch.Tensor, low: float, high: float,
               cap: float) -> torch.Tensor:
    """Per-token value of a clipped surrogate at `ratio` (float64): regular max(-A r, -A clip(r)), dual_clip that
    capped at -A c where A < 0, cispo -A min(r, 1 + eps_high) log p (the weight's gradient stopped)."""
    if policy == "cispo":
        return -adv * ratio.clamp(max=high) * logprob
    value = torch.maximum(-adv * ratio, -adv * ratio.clamp(low, high))
    if policy == "dual_clip":
        value = torch.where(adv < 0, torch.minimum(value, -adv * cap), value)
    return value


def _kl(estimator: str, x: torch.Tensor, cap: float) -> torch.Tensor:
    """An estimator's value at x = log p - log p_ref (float64): k1 x, abs |x|, k2 x^2/2, k3 e^-x + x - 1 (at most
    `cap`)."""
    if estimator == "k1":
        return x
    if estimator == "abs":
        return x.abs()
    if estimator == "k2":
        return 0.5 * x * x
    return (torch.exp(-x) + x - 1).clamp(max=cap)


def policy_loss_gaps(logprobs: torch.Tensor, old: torch.Tensor | None, ref: torch.Tensor | None,
                     advantages: torch.Tensor, weights: dict[str, torch.Tensor], lp_gap: torch.Tensor,
                     h_gap: torch.Tensor | float, entropy: torch.Tensor | None, settings,
                     kl_cap: float = math.inf) -> tuple[dict[str, float], torch.Tensor]:
    """Two float32 computations of a policy loss and its metrics, each a weighted sum over the N tokens of per-token
    terms of the token's logprob (and entropy), when the two sides' logprobs differ by at most `lp_gap` and their
    entropies by `h_gap` ([N]); `logprobs`, `entropy`: either side's. `weights`: per-token weights, "loss" (with the
    data-parallel factor), "metric" (pg_loss, kl, entropy) and "token" (the clip fractions, ppo_kl); `old` None is
    on-policy (the ratio is 1 on both sides, whatever their logprobs). `settings`: the loss's settings
    (rl.core.algorithms.LossSettings, read by attribute); `kl_cap`: k3's cap (rl.core's K3_BOUND).

    Each term moves by at most its largest slope within the token's interval [log p - gap, log p + gap] times the gap
    (the mean value theorem), the terms' slopes being monotone or constant between kinks: the surrogate's (`policy`:
    regular, dual_clip, cispo) |A| r at the interval's end where unclipped, 0 where clipped (cispo: |A| (min(r, 1 +
    eps_high) + |log p| r) while r < 1 + eps_high); the KL estimator's (k1 and abs 1, k2 |x|, k3 |1 - e^-x|
    below its cap, 0 above) at the interval's ends; the entropy's and ppo_kl's 1. A clip fraction counts a token
    differently only where its interval reaches a clip edge (1 - eps_low, 1 + eps_high; c for the lower fraction).
    Each side's sum over the N tokens (and the few roundings of each weight: a division by a count and by the
    denominator, the world size, a coefficient) is within gamma_(N+4) of the sum of the terms' magnitudes.

    Returns (value gaps by metric name, "loss" included; slope gap [N]): the slope gap bounds how far the loss's
    slope in a token's logprob (the gradient's weight w1 of `log_softmax_grad_gap`) moves within the interval: the
    surrogate's |A| (r_hi - r_lo) where unclipped, its jump |A| r_hi where the interval reaches a clip edge; the
    KL's (k2 2 gap, k3 |e^-x_lo - e^-x_hi|), its jump at a kink within the interval (abs at 0: 2, k3's cap: its
    slope), times kl_coef."""
    policy, clip_ratio_c = settings.policy_loss_type, settings.clip_ratio_c
    assert policy in ("regular", "dual_clip", "cispo"), f"no per-token bound for the {policy} loss"
    kl = settings.kl_estimator_type
    kl_coef = settings.kl_loss_coef if settings.use_kl_loss else 0.0
    entropy_coef = settings.entropy_loss_coef if settings.use_entropy_loss else 0.0
    f64 = lambda t: t.detach().double()  # noqa: E731
    lp = f64(logprobs)
    n = lp.numel()
    gap = torch.as_tensor(lp_gap, dtype=torch.float64, device=lp.device).expand_as(lp)
    adv = f64(advantages)
    low, high = 1 - settings.eps_clip_low, 1 + settings.eps_clip_high
    log_ratio = torch.zeros_like(lp) if old is None else lp - f64(old)
    moves = torch.zeros_like(lp) if old is None else gap  # on-policy: the ratio is 1 on both sides
    r, r_lo, r_hi = torch.exp(log_ratio), torch.exp(log_ratio - moves), torch.exp(log_ratio + moves)
    lp_hi = lp.abs() + gap

    # the surrogate: where along the interval it is unclipped (its slope -A r), and its edges
    if policy == "cispo":
        active = torch.ones_like(lp, dtype=torch.bool)
        moving = (r_lo < high) & (old is not None)  # the ratio's own move, where unclipped and not on-policy
        pg_slope = adv.abs() * (r_hi.clamp(max=high) + lp_hi * r_hi * moving)
        pg_grad_gap = adv.abs() * (r_hi.clamp(max=high) - r_lo.clamp(max=high))
        edges = [high]
    else:
        top = clip_ratio_c if policy == "dual_clip" else math.inf
        active = torch.where(adv > 0, r_lo <= high, torch.where(adv < 0, (r_hi >= low) & (r_lo <= top), False))
        pg_slope = torch.where(active, adv.abs() * r_hi, 0.0)
        edges = [low, high] + ([clip_ratio_c] if policy == "dual_clip" else [])
        pg_grad_gap = torch.where(active, adv.abs() * (r_hi - r_lo), 0.0)
    reaches = lambda edge: (r_lo <= edge) & (edge <= r_hi)  # noqa: E731
    near = torch.zeros_like(lp, dtype=torch.bool)
    for edge in edges:
        near |= reaches(edge)
    near_lower = reaches(clip_ratio_c) if policy == "dual_clip" else torch.zeros_like(near)
    if policy != "cispo":  # cispo's slope -A min(r, 1 + eps_high) has no jump
        pg_grad_gap = pg_grad_gap + torch.where(near, adv.abs() * r_hi, 0.0)
    pg = _surrogate(policy, adv, r, lp, low, high, clip_ratio_c).abs() + pg_slope * gap

    # the KL estimator at x = log p - log p_ref, over [x - gap, x + gap]
    kl_slope = kl_grad_gap = kl_value = torch.zeros_like(lp)
    if ref is not None:
        x = lp - f64(ref)
        x_lo, x_hi = x - gap, x + gap
        v_lo, v_hi = _kl(kl, x_lo, kl_cap), _kl(kl, x_hi, kl_cap)
        kl_value = torch.maximum(v_lo.abs(), v_hi.abs())
        if kl in ("k1", "abs"):
            kl_slope = torch.ones_like(lp)
            kl_grad_gap = 2.0 * ((x_lo <= 0) & (x_hi >= 0)) if kl == "abs" else torch.zeros_like(lp)
        elif kl == "k2":
            kl_slope, kl_grad_gap = torch.maximum(x_lo.abs(), x_hi.abs()), 2 * gap
        else:
            k3_slope = torch.maximum((1 - torch.exp(-x_lo)).abs(), (1 - torch.exp(-x_hi)).abs())
            raw_lo, raw_hi = torch.exp(-x_lo) + x_lo - 1, torch.exp(-x_hi) + x_hi - 1
            smallest = torch.where((x_lo <= 0) & (x_hi >= 0), 0.0, torch.minimum(raw_lo, raw_hi))
            capped = smallest >= kl_cap  # constant over the whole interval
            crosses = (~capped) & (torch.maximum(raw_lo, raw_hi) >= kl_cap)
            kl_slope = torch.where(capped, 0.0, k3_slope)
            kl_grad_gap = torch.where(capped, 0.0, (torch.exp(-x_lo) - torch.exp(-x_hi)).abs())
            kl_grad_gap = kl_grad_gap + torch.where(crosses, k3_slope, 0.0)
    kl_term = kl_value + kl_slope * gap

    h = torch.zeros_like(lp) if entropy is None else f64(entropy)
    h_gap = torch.as_tensor(h_gap, dtype=torch.float64, device=lp.device).expand_as(lp)
    rtol = network_rtol([n + 4], torch.float32)

    def total(weight: torch.Tensor, moved: torch.Tensor, magnitude: torch.Tensor) -> float:
        w = f64(weight).abs()
        return float((w * moved).sum() + rtol * (w * magnitude).sum())

    w_loss, w_metric, w_token = weights["loss"], weights["metric"], weights["token"]
    loss_moved = pg_slope * gap + kl_coef * kl_slope * gap + entropy_coef * h_gap
    loss_magnitude = pg + kl_coef * kl_term + entropy_coef * (h + h_gap)
    ppo_moved = torch.zeros_like(lp) if old is None else gap
    gaps = {
        "loss": total(w_loss, loss_moved, loss_magnitude),
        "pg_loss": total(w_metric, pg_slope * gap, pg),
        "kl": total(w_metric, kl_slope * gap, kl_term),
        "entropy": total(w_metric, h_gap, h + h_gap),
        "pg_clipfrac": total(w_token, near.double(), torch.ones_like(lp)),
        "pg_clipfrac_lower": total(w_token, near_lower.double(), torch.ones_like(lp)),
        "ppo_kl": total(w_token, ppo_moved, log_ratio.abs() + ppo_moved),
    }
    gaps["kl_loss"] = gaps["kl"]
    return gaps, f64(w_loss).abs() * (pg_grad_gap + kl_coef * kl_grad_gap)
