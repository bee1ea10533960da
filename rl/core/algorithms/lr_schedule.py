"""The learning rate of each optimizer step: a linear warm-up, then constant or a decay to `min_lr`.

After the warm-up the decays are transformers' `get_cosine_schedule_with_warmup` / `get_linear_schedule_with_warmup`
(SkyRL's `scheduler=cosine` / `linear`) and Megatron-Core's `OptimizerParamScheduler` with `lr_decay_style` cosine /
linear and `min_lr` (NeMo RL's megatron scheduler): with progress p = (step - warmup) / (decay_steps - warmup),
capped at 1, the rate is min_lr + (lr - min_lr) * d(p) with d = (1 + cos(pi p)) / 2 or 1 - p. The warm-up gives
step k (0-based) lr * (k + 1) / warmup, so that the first step already moves the weights (transformers' first warm-up
step has rate 0).
"""

from __future__ import annotations

import math


def lr_factor(step: int, warmup: int, scheduler: str = "constant", decay_steps: int = 0,
              min_ratio: float = 0.0) -> float:
    """The rate of optimizer step `step` (0-based) as a multiple of the peak lr. `decay_steps`: the step at which a
    decay reaches `min_ratio` (= min_lr / lr) and stays."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if scheduler == "constant":
        return 1.0
    progress = min(max(step - warmup, 0) / max(decay_steps - warmup, 1), 1.0)
    decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if scheduler == "cosine" else 1.0 - progress
    return min_ratio + (1.0 - min_ratio) * decay
