"""The critic's loss, assembled once for every backend like the policy's (`loss.py`).

Per token, with values V, the values before the update V_old, returns R and clip range c (PPO's clipped value
loss, as veRL's and SkyRL's)::

    loss = 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)      (c = None: 0.5 * (V - R)^2)

reduced over the mini-batch by the same `trainer.algorithm.loss_reduction` and `LossNormalizer` as the policy loss,
so the critic's gradients, like the policy's, do not depend on the micro-batch or data-parallel split. SkyRL
always averages per sequence, then over sequences (`sequence_mean`); veRL takes the critic's own aggregation mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rl.core.algorithms.reduction import LOSS_REDUCTIONS, LossNormalizer, masked_sum


@dataclass(frozen=True)
class ValueLossSettings:
    """`trainer.algorithm.value_clip` (None: no clipping), `trainer.algorithm.loss_reduction` and
    `generator.max_generate_length` (the `seq_mean_token_sum_norm` reduction's constant)."""

    value_clip: float | None = 0.2
    loss_reduction: str = "token_mean"
    max_generate_length: int | None = None

    def __post_init__(self) -> None:
        if self.value_clip is not None and not self.value_clip > 0:
            raise ValueError(f"trainer.algorithm.value_clip must be > 0 or null (no clipping), got {self.value_clip}")

    @classmethod
    def from_config(cls, algorithm_cfg: Any, generator_cfg: Any = None) -> ValueLossSettings:
        def read(cfg, key, default):
            if cfg is None:
                return default
            return cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key, default)

        return cls(value_clip=read(algorithm_cfg, "value_clip", 0.2),
                   loss_reduction=read(algorithm_cfg, "loss_reduction", "token_mean"),
                   max_generate_length=read(generator_cfg, "max_generate_length", None))


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, value_clip: float | None
                       ) -> tuple[Tensor, Tensor]:
    """(per-token loss, per-token 1 where the clipped term is the larger one) for any shape of token tensors."""
    unclipped = (values - returns) ** 2
    if value_clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
    clipped = (clipped_values - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).to(values.dtype)


def compute_value_loss(settings: ValueLossSettings, values: Tensor, old_values: Tensor, returns: Tensor,
                       loss_mask: Tensor, normalizer: LossNormalizer, *, seq_ids: Tensor | None = None,
                       num_sequences: int | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Micro-batch loss ``reduce(value loss) * dp_world_size`` and its share of the mini-batch metrics: ``vf_loss``
    (the reduction), ``vf_clipfrac`` and ``values_mean`` (token means). Shapes and `normalizer` as in
    `compute_policy_loss`."""
    for name, tensor in (("old_values", old_values), ("returns", returns), ("loss_mask", loss_mask)):
        if tensor.shape != values.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but values has {tuple(values.shape)}")
    if normalizer.reduction != settings.loss_reduction:
        raise ValueError(f"normalizer was built for '{normalizer.reduction}' but trainer.algorithm.loss_reduction "
                         f"is '{settings.loss_reduction}'")
    if seq_ids is None and num_sequences is None and values.dim() == 2:
        num_sequences = values.shape[0]
    reduction = LOSS_REDUCTIONS.get(settings.loss_reduction)
    per_token, clipped = clipped_value_loss(values, old_values, returns, settings.value_clip)
    loss = reduction(per_token, loss_mask, normalizer.denominator, seq_ids, num_sequences)
    metrics = {"vf_loss": loss.detach(),
               "vf_clipfrac": masked_sum(clipped, loss_mask) / normalizer.num_tokens,
               "values_mean": masked_sum(values.detach(), loss_mask) / normalizer.num_tokens}
    return loss * normalizer.dp_world_size, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens: 1 when the critic predicts the returns, 0 when it predicts
    no better than their mean, negative when worse; NaN when the returns do not vary beyond float32 rounding (all
    rewards equal: nothing to explain)."""
    mask = mask.bool()
    v, r = values[mask].double(), returns[mask].double()
    scale = max(float(r.abs().max()), float(v.abs().max())) if r.numel() else 0.0
    if r.numel() < 2 or float(r.std()) <= torch.finfo(torch.float32).eps * scale:
        return float("nan")
    return float(1.0 - (r - v).var() / r.var())
