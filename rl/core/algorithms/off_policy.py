"""Trainer-vs-rollout mismatch, measured and corrected (`trainer.algorithm.off_policy_correction`, SkyRL's keys).

The rollout engine samples with its own numerics (other kernels, another precision, weights a sync behind), so its
logprobs of the sampled tokens differ from the trainer's `old_logprobs` of the same weights. With the importance
ratio r = pi_old / pi_rollout per loss token:

- `mismatch_metrics`: the gap every step (mean and max |old - rollout|, the k3 estimate of KL(rollout || old), the
  normalised effective sample size of r).
- `correct`: the corrections, all off by default, as per-token weights for the policy-gradient term and a loss mask
  with rejected tokens removed. `tis_ratio_type` (`TIS_RATIOS`): `token` weights each token by min(r, cap),
  `sequence` each sequence by min(prod r, cap) (truncated importance sampling). `sequence_mask_metric`
  (`SEQUENCE_MASKS`): `geometric` rejects sequences whose geometric-mean r leaves [geo_mask_low, geo_mask_high],
  `product` those whose prod r leaves [product_mask_low, product_mask_high]. `outlier_token_is_threshold_low/high`
  reject sequences with any token's r outside the bounds; `token_mask_is_threshold_low/high` (both set) reject
  single tokens.

Tensors are flat [N] over the tokens of `num_sequences` sequences (`seq_ids`), fp32; only loss-mask tokens count.
Rejected tokens leave the loss mask, so they leave the loss's token and sequence counts too. The weights are applied
by the caller to the advantages: every registered policy loss but the covariance ones (`COVARIANCE_LOSSES`, refused
with TIS by the config) is linear in the advantage of each token with a non-negative factor (a test checks it), so
scaling the advantage is scaling that token's policy-gradient term in every loss path (logits, fused kernels,
megatron), and the KL and entropy terms stay unweighted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from rl.core.algorithms.loss import ROLLOUT_GAP
from rl.core.algorithms.segments import segment_sum
from rl.core.registry import Registry

LOG_RATIO_BOUND = 20.0  # exp(+-20): ratios beyond it are clamped before exponentiation (no inf/0 in products)

# (log_ratio [N], mask [N] bool, seq_ids [N], num_sequences, config) -> (weight [N], metrics)
TIS_RATIOS: Registry[Callable[..., tuple[Tensor, dict[str, float]]]] = Registry("off-policy TIS ratio type")
# (log_ratio [N], mask [N] bool, seq_ids [N], num_sequences, config) -> (keep [S] bool, metrics)
SEQUENCE_MASKS: Registry[Callable[..., tuple[Tensor, dict[str, float]]]] = Registry("off-policy sequence mask")


def _ratio(log_ratio: Tensor) -> Tensor:
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()


def _fraction(flags: Tensor, of: Tensor | int) -> float:
    total = int(of.sum()) if isinstance(of, Tensor) else of
    return float(flags.sum()) / max(total, 1)


def _sequence_log_ratio(log_ratio: Tensor, mask: Tensor, seq_ids: Tensor, num_sequences: int) -> Tensor:
    return segment_sum(log_ratio * mask, seq_ids, num_sequences)


def mismatch_metrics(old: Tensor, rollout: Tensor, mask: Tensor) -> dict[str, float]:
    """The trainer-vs-rollout gap over the loss tokens (empty without any)."""
    if not bool(mask.any()):
        return {}
    diff = (old - rollout)[mask]
    ratio = _ratio(diff)
    return {
        ROLLOUT_GAP: float(diff.abs().mean()),
        "rollout_logprob_abs_diff_max": float(diff.abs().max()),
        "rollout_kl_k3": float((ratio - 1 - diff.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)).mean()),
        # (sum r)^2 / (n sum r^2): 1 when every ratio is equal, 1/n when one token carries all the weight
        "rollout_is_ess": float(ratio.sum() ** 2 / (ratio.numel() * (ratio**2).sum())),
    }


@TIS_RATIOS.register("token")
def token_tis(log_ratio: Tensor, mask: Tensor, seq_ids: Tensor, num_sequences: int, config: Any):
    ratio, cap = _ratio(log_ratio), config.token_tis_ratio_clip_high
    return ratio.clamp(max=cap), {"tis_token_clip_high_ratio": _fraction((ratio > cap) & mask, mask)}


@TIS_RATIOS.register("sequence")
def sequence_tis(log_ratio: Tensor, mask: Tensor, seq_ids: Tensor, num_sequences: int, config: Any):
    ratio = _ratio(_sequence_log_ratio(log_ratio, mask, seq_ids, num_sequences))
    cap = config.sequence_tis_ratio_clip_high
    return ratio.clamp(max=cap)[seq_ids], {"tis_seq_clip_high_ratio": _fraction(ratio > cap, num_sequences)}


def _bounded(name: str, value: Tensor, low: float, high: float, num_sequences: int):
    over, under = value > high, value < low
    keep = ~(over | under)
    return keep, {f"{name}_masked_ratio": _fraction(~keep, num_sequences),
                  f"{name}_over_high_ratio": _fraction(over, num_sequences),
                  f"{name}_under_low_ratio": _fraction(under, num_sequences)}


@SEQUENCE_MASKS.register("geometric")
def geometric_mask(log_ratio: Tensor, mask: Tensor, seq_ids: Tensor, num_sequences: int, config: Any):
    tokens = segment_sum(mask.float(), seq_ids, num_sequences).clamp(min=1.0)
    mean = _ratio(_sequence_log_ratio(log_ratio, mask, seq_ids, num_sequences) / tokens)
    return _bounded("geo_sequence_mask", mean, config.geo_mask_low, config.geo_mask_high, num_sequences)


@SEQUENCE_MASKS.register("product")
def product_mask(log_ratio: Tensor, mask: Tensor, seq_ids: Tensor, num_sequences: int, config: Any):
    product = _ratio(_sequence_log_ratio(log_ratio, mask, seq_ids, num_sequences))
    return _bounded("product_sequence_mask", product, config.product_mask_low, config.product_mask_high,
                    num_sequences)


def correction_enabled(config: Any) -> bool:
    """Whether any correction is on (token masking needs both of its bounds)."""
    return (config.tis_ratio_type is not None or config.sequence_mask_metric is not None
            or config.outlier_token_is_threshold_low is not None
            or config.outlier_token_is_threshold_high is not None
            or (config.token_mask_is_threshold_low is not None and config.token_mask_is_threshold_high is not None))


def _outlier_sequences(config: Any, ratio: Tensor, mask: Tensor, seq_ids: Tensor, num_sequences: int,
                       metrics: dict[str, float]) -> Tensor:
    """The mask without the sequences that have a token outside the outlier bounds."""
    low, high = config.outlier_token_is_threshold_low, config.outlier_token_is_threshold_high
    if low is None and high is None:
        return mask
    over = (ratio > high) & mask if high is not None else torch.zeros_like(mask)
    under = (ratio < low) & mask if low is not None else torch.zeros_like(mask)
    seq_over = segment_sum(over.float(), seq_ids, num_sequences) > 0
    seq_under = segment_sum(under.float(), seq_ids, num_sequences) > 0
    keep = ~(seq_over | seq_under)
    metrics.update(outlier_seq_masked_ratio=_fraction(~keep, num_sequences),
                   outlier_seq_over_high_ratio=_fraction(seq_over, num_sequences),
                   outlier_seq_under_low_ratio=_fraction(seq_under, num_sequences))
    return mask & keep[seq_ids]


def _token_mask(config: Any, ratio: Tensor, mask: Tensor, metrics: dict[str, float]) -> Tensor:
    """The mask without the single tokens outside [token_mask_is_threshold_low, token_mask_is_threshold_high]."""
    low, high = config.token_mask_is_threshold_low, config.token_mask_is_threshold_high
    if low is None or high is None:
        return mask
    outside = ((ratio < low) | (ratio > high)) & mask
    metrics["token_mask_masked_ratio"] = _fraction(outside, mask)
    return mask & ~outside


def correct(config: Any, old: Tensor, rollout: Tensor, mask: Tensor, seq_ids: Tensor, num_sequences: int
            ) -> tuple[Tensor, Tensor, dict[str, float]]:
    """(weight [N] for the policy-gradient term, loss mask [N] with rejected tokens removed, metrics), `config`
    being `trainer.algorithm.off_policy_correction`. SkyRL's order: outlier sequences, the token mask, TIS, the
    sequence mask; each step is computed over the tokens the steps before kept, so a sequence's TIS product and
    its sequence-mask statistic leave out the tokens the token mask dropped."""
    mask = mask.bool()
    weight = torch.ones_like(old)
    if not correction_enabled(config):
        return weight, mask, {}
    log_ratio = old.float() - rollout.float()
    ratio = _ratio(log_ratio)
    metrics: dict[str, float] = {}
    mask = _outlier_sequences(config, ratio, mask, seq_ids, num_sequences, metrics)
    mask = _token_mask(config, ratio, mask, metrics)
    if config.tis_ratio_type is not None:
        weight, found = TIS_RATIOS.get(config.tis_ratio_type)(log_ratio, mask, seq_ids, num_sequences, config)
        metrics.update(found)
    if config.sequence_mask_metric is not None:
        keep, found = SEQUENCE_MASKS.get(config.sequence_mask_metric)(log_ratio, mask, seq_ids, num_sequences,
                                                                       config)
        metrics.update(found)
        mask = mask & keep[seq_ids]
    return weight * mask, mask, metrics
