"""Per-token policy-gradient losses, registered by name in `POLICY_LOSSES`.

Every loss has the same signature::

    fn(logprob, old_logprob, advantages, mask, *, eps_clip_low, eps_clip_high, clip_ratio_c,
       seq_ids=None, num_sequences=None, **options) -> (per_token_loss, metrics)

- All token tensors share one shape: padded ``[B, T]`` or flat packed ``[N]``.
- `mask` (bool or 0/1) marks the tokens in the loss; gspo reads it for its sequence-level ratio, clip_cov and
  kl_cov for their covariance statistic; the reduction (see `reduction.py`) applies it to every loss.
- `options` are the settings only some losses read (`LossSettings.loss_options`): sapo's ``tau_pos`` /
  ``tau_neg``, clip_cov's ``clip_cov_ratio`` / ``clip_cov_lb`` / ``clip_cov_ub``, kl_cov's ``kl_cov_frac`` /
  ``ppo_kl_coef``; the other losses ignore them.
- `seq_ids` / `num_sequences` give each token's sequence (see `segments.py`); only gspo reads them. For ``[B, T]``
  tensors `seq_ids` defaults to the row index; for packed tensors pass ``PackedBatch.token_seq_ids()``.
- `per_token_loss` is unreduced (same shape as `logprob`); values outside `mask` are meaningless.
- `metrics` maps names to detached per-token 0/1 or float tensors; reduce them over `mask` (e.g. a masked mean)
  to get fractions: ``pg_clipfrac`` (clipping changed the loss), ``pg_clipfrac_lower`` (dual clip changed it),
  ``ppo_kl`` (old_logprob - logprob), and those named in each loss's docstring.
- Every loss but those of `COVARIANCE_LOSSES` is a function of each token's own values, linear in its advantage
  with a non-negative factor (`off_policy.py` relies on it to apply TIS weights through the advantages).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl.core.algorithms.segments import count_segments, resolve_seq_ids, segment_masked_mean
from rl.core.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")

LOG_RATIO_BOUND = 20.0
GSPO_LOG_RATIO_MAX = 10.0

COVARIANCE_LOSSES = ("clip_cov", "kl_cov")
"""Losses that pick tokens by a covariance over the micro-batch's tokens: a token's loss depends on the others and
is not linear in its advantage, so their gradient depends on the micro-batch split and TIS weights cannot ride on
the advantages (the config refuses them with off_policy_correction.tis_ratio_type)."""


def _ratio(logprob: Tensor, old_logprob: Tensor) -> Tensor:
    return torch.exp((logprob - old_logprob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, eps_clip_low: float, eps_clip_high: float):
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_clip_low, 1.0 + eps_clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).detach().to(ratio.dtype)


def _ppo_kl(logprob: Tensor, old_logprob: Tensor) -> Tensor:
    return (old_logprob - logprob).detach()


@POLICY_LOSSES.register("regular")
def regular(
    logprob,
    old_logprob,
    advantages,
    mask=None,
    *,
    eps_clip_low,
    eps_clip_high,
    clip_ratio_c=3.0,
    seq_ids=None,
    num_sequences=None,
    **options,
):
    """PPO clip with asymmetric range: max(-A * r, -A * clip(r, 1 - eps_clip_low, 1 + eps_clip_high))."""
    loss, clipped = _clipped_surrogate(_ratio(logprob, old_logprob), advantages, eps_clip_low, eps_clip_high)
    return loss, {"pg_clipfrac": clipped, "ppo_kl": _ppo_kl(logprob, old_logprob)}


@POLICY_LOSSES.register("dual_clip")
def dual_clip(
    logprob,
    old_logprob,
    advantages,
    mask=None,
    *,
    eps_clip_low,
    eps_clip_high,
    clip_ratio_c=3.0,
    seq_ids=None,
    num_sequences=None,
    **options,
):
    """`regular`, and for A < 0 the loss capped at -A * clip_ratio_c (dual-clip PPO, clip_ratio_c > 1)."""
    if not clip_ratio_c > 1.0:
        raise ValueError(f"dual_clip needs clip_ratio_c > 1 (trainer.algorithm.clip_ratio_c), got {clip_ratio_c}")
    loss, clipped = _clipped_surrogate(_ratio(logprob, old_logprob), advantages, eps_clip_low, eps_clip_high)
    cap = -advantages * clip_ratio_c
    negative = advantages < 0
    lower = (negative & (loss > cap)).detach().to(loss.dtype)
    loss = torch.where(negative, torch.minimum(loss, cap), loss)
    return loss, {"pg_clipfrac": clipped, "pg_clipfrac_lower": lower, "ppo_kl": _ppo_kl(logprob, old_logprob)}


@POLICY_LOSSES.register("gspo")
def gspo(
    logprob,
    old_logprob,
    advantages,
    mask=None,
    *,
    eps_clip_low,
    eps_clip_high,
    clip_ratio_c=3.0,
    seq_ids=None,
    num_sequences=None,
    **options,
):
    """GSPO-token: s_t = sg[s_i] * exp(logp_t - sg[logp_t]), s_i = exp(mean over sequence i of (logp - old)).

    The sequence ratio is clipped to [1 - eps_clip_low, 1 + eps_clip_high] (the paper uses 3e-4 / 4e-4) and pairs
    with the ``sequence_mean`` reduction as in the paper. `mask` selects the tokens of the sequence mean.
    """
    mask = torch.ones_like(logprob, dtype=torch.bool) if mask is None else mask
    ids = resolve_seq_ids(logprob, seq_ids)
    count = count_segments(ids, num_sequences)
    seq_log_ratio = segment_masked_mean((logprob - old_logprob).detach(), mask, ids, count)
    log_ratio = logprob - logprob.detach() + seq_log_ratio[ids.long()]
    ratio = torch.exp(log_ratio.clamp(max=GSPO_LOG_RATIO_MAX))
    loss, clipped = _clipped_surrogate(ratio, advantages, eps_clip_low, eps_clip_high)
    return loss, {"pg_clipfrac": clipped, "ppo_kl": _ppo_kl(logprob, old_logprob)}


@POLICY_LOSSES.register("cispo")
def cispo(
    logprob,
    old_logprob,
    advantages,
    mask=None,
    *,
    eps_clip_low,
    eps_clip_high,
    clip_ratio_c=3.0,
    seq_ids=None,
    num_sequences=None,
    **options,
):
    """CISPO (MiniMax-M1): -sg(min(r, 1 + eps_clip_high)) * A * logp; only the upper bound clips the weight."""
    ratio = _ratio(logprob, old_logprob)
    weight = ratio.clamp(max=1.0 + eps_clip_high).detach()
    clipped = (ratio > 1.0 + eps_clip_high).detach().to(ratio.dtype)
    return -weight * advantages * logprob, {"pg_clipfrac": clipped, "ppo_kl": _ppo_kl(logprob, old_logprob)}


@POLICY_LOSSES.register("sapo")
def sapo(
    logprob,
    old_logprob,
    advantages,
    mask=None,
    *,
    eps_clip_low,
    eps_clip_high,
    clip_ratio_c=3.0,
    seq_ids=None,
    num_sequences=None,
    tau_pos=1.0,
    tau_neg=1.05,
    **options,
):
    """SAPO (arXiv 2511.20347): -f(r) * A with the soft gate f(r) = sigmoid(tau * (r - 1)) * 4 / tau,
    tau = tau_pos where A > 0 and tau_neg elsewhere (log ratio clamped to +-20, as SkyRL and veRL).

    The gate's slope at r = 1 is 1, so near the old policy it is the plain policy gradient; away from it the
    gradient fades smoothly instead of being cut off by a clip. The peers pair it with sequence_mean (veRL forces
    it, SkyRL warns otherwise); here trainer.algorithm.loss_reduction decides, as for every loss.
    """
    ratio = _ratio(logprob, old_logprob)
    tau = torch.where(advantages > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * advantages, {"ppo_kl": _ppo_kl(logprob, old_logprob)}


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp(min=1.0)


def _covariance(logprob: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """(A - mean A) * (logp - mean logp) per token, the means over the masked tokens; detached (it only selects)."""
    adv, lp = advantages.detach(), logprob.detach()
    return (adv - _masked_mean(adv, mask)) * (lp - _masked_mean(lp, mask))


def _token_flags(like: Tensor, flat_index: Tensor) -> Tensor:
    flags = torch.zeros(like.numel(), dtype=torch.bool, device=like.device)
    return flags.index_fill(0, flat_index, True).reshape(like.shape)


@POLICY_LOSSES.register("clip_cov")
def clip_cov(
    logprob,
    old_logprob,
    advantages,
    mask=None,
    *,
    eps_clip_low,
    eps_clip_high,
    clip_ratio_c=3.0,
    seq_ids=None,
    num_sequences=None,
    clip_cov_ratio=0.0002,
    clip_cov_lb=1.0,
    clip_cov_ub=5.0,
    **options,
):
    """Clip-Cov (arXiv 2505.22617): the PPO clip loss max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high)), with
    the gradient cut (loss 0) on max(1, int(clip_cov_ratio * n)) tokens drawn at random among those whose
    covariance (A - mean A) * (logp - mean logp) lies in (clip_cov_lb, clip_cov_ub) and that the PPO clip left
    alone; n is the number of masked tokens, r = exp(logp - old) unclamped (as SkyRL and veRL).

    Tokens with a high covariance between advantage and logprob drive the collapse of the policy's entropy;
    detaching a few of them keeps it up. The means, n and the draw cover the masked tokens of the micro-batch
    this call sees (one data-parallel rank's micro-batch, token-balanced here); the peers take the same statistic
    over their own micro-batch (a fixed number of padded sequences), so the selection, unlike the other losses'
    gradient, depends on how a mini-batch is split. The draw uses torch's global generator, as the peers' does.
    Metric ``clip_cov_frac`` is the peers' ``pg_clipfrac``; ``pg_clipfrac`` is the PPO clip's, as for `regular`.
    """
    mask = torch.ones_like(logprob, dtype=torch.bool) if mask is None else mask.bool()
    ratio = torch.exp(logprob - old_logprob)
    loss, clipped = _clipped_surrogate(ratio, advantages, eps_clip_low, eps_clip_high)
    cov = _covariance(logprob, advantages, mask)
    candidates = mask & (clipped == 0) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    index = torch.nonzero(candidates.reshape(-1)).squeeze(1)
    count = max(int(clip_cov_ratio * int(mask.sum())), 1)
    drawn = index[torch.randperm(index.numel(), device=index.device)[:count]]
    cut = _token_flags(logprob, drawn)
    loss = torch.where(cut, torch.zeros_like(loss), loss)
    metrics = {"pg_clipfrac": clipped, "clip_cov_frac": cut.to(loss.dtype), "ppo_kl": _ppo_kl(logprob, old_logprob)}
    return loss, metrics


@POLICY_LOSSES.register("kl_cov")
def kl_cov(
    logprob,
    old_logprob,
    advantages,
    mask=None,
    *,
    eps_clip_low,
    eps_clip_high,
    clip_ratio_c=3.0,
    seq_ids=None,
    num_sequences=None,
    kl_cov_frac=0.2,
    ppo_kl_coef=1.0,
    **options,
):
    """KL-Cov (arXiv 2505.22617): -A * r, plus ppo_kl_coef * |logp - old| on the max(1, int(kl_cov_frac * n))
    masked tokens of largest covariance (A - mean A) * (logp - mean logp); r = exp(logp - old) unclamped and no
    clip (as SkyRL and veRL); n is the number of masked tokens.

    The KL term holds the high-covariance tokens, which drive the entropy collapse, near the old policy. As for
    clip_cov, the statistic covers the masked tokens of the micro-batch this call sees, here token-balanced, in the
    peers a fixed number of padded sequences. Metric ``kl_cov_frac`` is the share of tokens that got the KL term.
    """
    mask = torch.ones_like(logprob, dtype=torch.bool) if mask is None else mask.bool()
    log_ratio = logprob - old_logprob
    loss = -advantages * torch.exp(log_ratio)
    cov = torch.where(mask, _covariance(logprob, advantages, mask), -torch.inf)
    valid = int(mask.sum())
    chosen = torch.zeros_like(mask)
    if valid:
        top = torch.topk(cov.reshape(-1), max(1, int(valid * kl_cov_frac))).indices
        chosen = _token_flags(logprob, top)
    loss = torch.where(chosen, loss + ppo_kl_coef * log_ratio.abs(), loss)
    return loss, {"kl_cov_frac": chosen.to(loss.dtype), "ppo_kl": _ppo_kl(logprob, old_logprob)}


@POLICY_LOSSES.register("importance_sampling")
def importance_sampling(
    logprob,
    old_logprob,
    advantages,
    mask=None,
    *,
    eps_clip_low,
    eps_clip_high,
    clip_ratio_c=3.0,
    seq_ids=None,
    num_sequences=None,
    **options,
):
    """-r * A with r = exp(logp - old), unclipped and not detached (SkyRL's and Tinker's `importance_sampling`).

    Its gradient is -r * A * grad logp: the policy gradient of samples drawn from the old policy, reweighted
    without a trust region. With `advantage_estimator=no_op` and per-token advantages from the teacher's reverse
    KL it is on-policy distillation. Metric ``importance_ratio`` is r (its token mean is SkyRL's metric).
    """
    ratio = torch.exp(logprob - old_logprob)
    return -ratio * advantages, {"importance_ratio": ratio.detach(), "ppo_kl": _ppo_kl(logprob, old_logprob)}


@POLICY_LOSSES.register("rollout_is")
def rollout_is(
    logprob,
    old_logprob,
    advantages,
    mask=None,
    *,
    eps_clip_low,
    eps_clip_high,
    clip_ratio_c=3.0,
    seq_ids=None,
    num_sequences=None,
    **options,
):
    """SkyRL's `rollout_is` (GLM-5's agentic loss): -sg(r * 1[1 - eps_clip_low < r < 1 + eps_clip_high]) * A * logp,
    r = exp(logp - old) with `old` the engine's rollout logprobs (the trainer hands them over as the old logprobs for
    this loss: `rl.trainer.rollout_mismatch.anchor_on_rollout`), log ratio clamped to +-20.

    CISPO's weighted policy gradient, but a token whose ratio leaves the band contributes nothing (CISPO clamps its
    weight instead). Metric ``pg_clipfrac``: the share of tokens outside the band (SkyRL's ``clip_ratio``).
    """
    ratio = _ratio(logprob, old_logprob)
    inside = (ratio > 1.0 - eps_clip_low) & (ratio < 1.0 + eps_clip_high)
    weight = torch.where(inside, ratio, torch.zeros_like(ratio)).detach()
    return -weight * advantages * logprob, {"pg_clipfrac": (~inside).to(ratio.dtype),
                                            "ppo_kl": _ppo_kl(logprob, old_logprob)}
