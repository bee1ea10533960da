"""Per-token policy-gradient losses, registered by name in `POLICY_LOSSES`.

Every loss has the same signature::

    fn(logprob, old_logprob, advantages, mask, *, eps_clip_low, eps_clip_high, clip_ratio_c,
       seq_ids=None, num_sequences=None) -> (per_token_loss, metrics)

- All token tensors share one shape: padded ``[B, T]`` or flat packed ``[N]``.
- `mask` (bool or 0/1) marks the tokens in the loss; only gspo reads it here (for its sequence-level ratio),
  the reduction (see `reduction.py`) applies it to every loss.
- `seq_ids` / `num_sequences` give each token's sequence (see `segments.py`); only gspo reads them. For ``[B, T]``
  tensors `seq_ids` defaults to the row index; for packed tensors pass ``PackedBatch.token_seq_ids()``.
- `per_token_loss` is unreduced (same shape as `logprob`); values outside `mask` are meaningless.
- `metrics` maps names to detached per-token 0/1 or float tensors; reduce them over `mask` (e.g. a masked mean)
  to get fractions: ``pg_clipfrac`` (clipping changed the loss), ``pg_clipfrac_lower`` (dual clip changed it),
  ``ppo_kl`` (old_logprob - logprob).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl.core.algorithms.segments import count_segments, resolve_seq_ids, segment_masked_mean
from rl.core.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")

LOG_RATIO_BOUND = 20.0
GSPO_LOG_RATIO_MAX = 10.0


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
):
    """CISPO (MiniMax-M1): -sg(min(r, 1 + eps_clip_high)) * A * logp; only the upper bound clips the weight."""
    ratio = _ratio(logprob, old_logprob)
    weight = ratio.clamp(max=1.0 + eps_clip_high).detach()
    clipped = (ratio > 1.0 + eps_clip_high).detach().to(ratio.dtype)
    return -weight * advantages * logprob, {"pg_clipfrac": clipped, "ppo_kl": _ppo_kl(logprob, old_logprob)}
