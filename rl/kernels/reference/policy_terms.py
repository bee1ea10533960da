"""The per-token pieces of the GRPO/PPO loss in closed form: value and derivative w.r.t. the token logprob.

`compute_policy_loss` in rl/core gets its gradient from autograd; the fused kernels need it explicitly, so every
formula here comes with its derivative, including autograd's conventions at the edges: clamp passes the gradient
at its bounds, maximum/minimum split it evenly on ties. The Triton and CUDA kernels implement these same formulas
(integer codes `POLICY_CODES` / `KL_CODES` pick the variant); this file is their oracle.

`plan_loss` turns the loss reduction and its mini-batch `LossNormalizer` into per-token weights, so every supported
reduction becomes ``loss = sum_t weight_t * token_loss_t`` and the kernels need no per-sequence pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.algorithms.kl import K3_BOUND, K3_LOG_RATIO_BOUND
from rl.core.algorithms.policy_loss import LOG_RATIO_BOUND
from rl.core.algorithms.segments import count_segments, resolve_seq_ids, segment_sum

POLICY_CODES = {"regular": 0, "dual_clip": 1, "cispo": 2}
KL_CODES = {"k1": 0, "abs": 1, "k2": 2, "k3": 3}
UNFUSED_POLICY_LOSSES = {
    "gspo": "its ratio is a sequence mean of logprobs, known only after every token of the sequence is scored",
    "clip_cov": "it picks tokens by a covariance over every token of the micro-batch, known only after all are scored",
    "kl_cov": "it picks tokens by a covariance over every token of the micro-batch, known only after all are scored",
    "sapo": "no kernel formula yet (a per-token gate: it could have one)",
    "importance_sampling": "no kernel formula yet (-r * A per token: it could have one)",
    "rollout_is": "no kernel formula yet (cispo's with a hard band: it could have one)",
}
"""Registered policy losses the kernels leave to the logits path, and why; the config refuses them with
trainer.policy.use_fused_kernels (rl/core/config/checks_values.py)."""


@dataclass(frozen=True)
class LossPlan:
    """Everything a fused loss kernel needs besides logits: per-token weights and scalar settings.

    `weight`: loss weight per token (reduction, denominator, dp_world_size; 0 off the loss mask);
    `metric_weight`: the same without dp_world_size (reduced metrics); `token_weight`: mask / num_tokens.
    """

    weight: Tensor
    metric_weight: Tensor
    token_weight: Tensor
    policy: int
    kl: int
    eps_clip_low: float
    eps_clip_high: float
    clip_ratio_c: float
    use_kl: bool
    kl_coef: float
    use_entropy: bool
    entropy_coef: float


def plan_loss(
    settings: LossSettings,
    normalizer: LossNormalizer,
    loss_mask: Tensor,
    seq_ids: Tensor | None = None,
    num_sequences: int | None = None,
) -> LossPlan:
    """Per-token weights for `settings.loss_reduction` over a flat [N] (or padded [B, T]) micro-batch."""
    if settings.policy_loss_type not in POLICY_CODES:
        raise ValueError(
            f"trainer.algorithm.policy_loss_type='{settings.policy_loss_type}' has no fused kernel "
            f"(supported: {sorted(POLICY_CODES)}); use trainer.kernels=torch for it"
        )
    if normalizer.reduction != settings.loss_reduction:
        raise ValueError(
            f"normalizer was built for '{normalizer.reduction}' but trainer.algorithm.loss_reduction "
            f"is '{settings.loss_reduction}'"
        )
    mask = loss_mask.bool()
    ids = resolve_seq_ids(loss_mask, seq_ids)
    weight = mask.float().reshape(-1) / normalizer.denominator
    if settings.loss_reduction == "sequence_mean":
        flat_ids = ids.reshape(-1).long()
        counts = segment_sum(mask.float().reshape(-1), flat_ids, count_segments(ids, num_sequences))
        weight = weight / counts.clamp(min=1.0)[flat_ids]
    return LossPlan(
        weight=weight * normalizer.dp_world_size,
        metric_weight=weight,
        token_weight=mask.float().reshape(-1) / normalizer.num_tokens,
        policy=POLICY_CODES[settings.policy_loss_type],
        kl=KL_CODES[settings.kl_estimator_type],
        eps_clip_low=settings.eps_clip_low,
        eps_clip_high=settings.eps_clip_high,
        clip_ratio_c=settings.clip_ratio_c,
        use_kl=settings.use_kl_loss,
        kl_coef=settings.kl_loss_coef,
        use_entropy=settings.use_entropy_loss,
        entropy_coef=settings.entropy_loss_coef,
    )


def _within(x: Tensor, low: float, high: float) -> Tensor:
    return ((x >= low) & (x <= high)).float()


def _max_grad(a: Tensor, b: Tensor, da: Tensor, db: Tensor) -> Tensor:
    return torch.where(a > b, da, torch.where(a < b, db, 0.5 * (da + db)))


def policy_terms(plan: LossPlan, logprob: Tensor, old: Tensor, adv: Tensor):
    """(token policy loss, its d/d logprob, clipped flag, lower-clip flag), all fp32 [N]."""
    log_ratio = logprob - old
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    d_ratio = ratio * _within(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    low, high = 1.0 - plan.eps_clip_low, 1.0 + plan.eps_clip_high
    if plan.policy == POLICY_CODES["cispo"]:
        weight = ratio.clamp(max=high)
        return -weight * adv * logprob, -weight * adv, (ratio > high).float(), torch.zeros_like(ratio)
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(low, high)
    loss = torch.maximum(unclipped, clipped)
    grad = _max_grad(unclipped, clipped, -adv * d_ratio, -adv * d_ratio * _within(ratio, low, high))
    clip_flag = (clipped > unclipped).float()
    if plan.policy != POLICY_CODES["dual_clip"]:
        return loss, grad, clip_flag, torch.zeros_like(ratio)
    cap = -adv * plan.clip_ratio_c
    negative = adv < 0
    lower = (negative & (loss > cap)).float()
    capped_grad = torch.where(loss < cap, grad, torch.where(loss > cap, torch.zeros_like(grad), 0.5 * grad))
    return (
        torch.where(negative, torch.minimum(loss, cap), loss),
        torch.where(negative, capped_grad, grad),
        clip_flag,
        lower,
    )


def kl_terms(plan: LossPlan, logprob: Tensor, ref: Tensor) -> tuple[Tensor, Tensor]:
    """(KL estimate, its d/d logprob), fp32 [N]."""
    diff = logprob - ref
    if plan.kl == KL_CODES["k1"]:
        return diff, torch.ones_like(diff)
    if plan.kl == KL_CODES["abs"]:
        return diff.abs(), torch.sign(diff)
    if plan.kl == KL_CODES["k2"]:
        return 0.5 * diff * diff, diff
    x = -diff
    xc = x.clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    value = torch.exp(xc) - xc - 1
    grad = (
        -(torch.exp(xc) - 1) * _within(x, -K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND) * _within(value, -K3_BOUND, K3_BOUND)
    )
    return value.clamp(-K3_BOUND, K3_BOUND), grad


def loss_terms(plan: LossPlan, logprob: Tensor, entropy: Tensor, old: Tensor, adv: Tensor, ref: Tensor | None):
    """Per-token weighted loss, its grads w.r.t. logprob and entropy, and per-token metric contributions.

    Returns (token_loss [N], grad_logprob [N], grad_entropy [N], metrics [N, 6]); metrics columns are
    pg_loss, kl, entropy (metric-weighted), pg_clipfrac, pg_clipfrac_lower, ppo_kl (token-weighted); summing
    over tokens gives the micro-batch's metric values.
    """
    mask = plan.weight != 0
    lp, old, adv = logprob.float(), old.float(), adv.float()
    pg, d_lp, clip_flag, lower = policy_terms(plan, lp, old, adv)
    total = pg
    kl = torch.zeros_like(lp)
    if ref is not None:
        kl, d_kl = kl_terms(plan, lp, ref.float())
        if plan.use_kl:
            total, d_lp = total + plan.kl_coef * kl, d_lp + plan.kl_coef * d_kl
    d_h = torch.full_like(lp, -plan.entropy_coef if plan.use_entropy else 0.0)
    if plan.use_entropy:
        total = total - plan.entropy_coef * entropy
    zero = torch.zeros_like(lp)
    token_loss = torch.where(mask, plan.weight * total, zero)
    grad_lp, grad_h = torch.where(mask, plan.weight * d_lp, zero), torch.where(mask, plan.weight * d_h, zero)
    mw, tw = plan.metric_weight, plan.token_weight
    metrics = torch.stack(
        [
            torch.where(mask, mw * pg, zero),
            torch.where(mask, mw * kl, zero),
            torch.where(mask, mw * entropy, zero),
            tw * clip_flag,
            tw * lower,
            torch.where(mask, tw * (old - lp), zero),
        ],
        dim=1,
    )
    return token_loss, grad_lp, grad_h, metrics


METRIC_NAMES = ("pg_loss", "kl", "entropy", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl")


def metrics_dict(plan: LossPlan, totals: Tensor, has_ref: bool, has_entropy: bool = True) -> dict[str, Tensor]:
    """Named metrics (the keys `compute_policy_loss` reports) from summed metric columns."""
    values = dict(zip(METRIC_NAMES, totals.detach().unbind(0), strict=True))
    out = {"pg_loss": values["pg_loss"]}
    if has_ref:
        out["kl"] = values["kl"]
        if plan.use_kl:
            out["kl_loss"] = values["kl"]
    if has_entropy:
        out["entropy"] = values["entropy"]
    out["pg_clipfrac"] = values["pg_clipfrac"]
    if plan.policy == POLICY_CODES["dual_clip"]:
        out["pg_clipfrac_lower"] = values["pg_clipfrac_lower"]
    out["ppo_kl"] = values["ppo_kl"]
    return out
