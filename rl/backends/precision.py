"""`trainer.bf16` on a worker: whether a strategy computes in bfloat16 (mixed precision: float32 weights in the
optimizer, float32 gradient reduction, float32 logprobs and loss), on any device."""

from __future__ import annotations

import torch


def bf16_compute(setting: bool | None, device: torch.device) -> bool:
    """`ModelSpec.bf16` resolved for this rank's device: null means bfloat16 on a GPU, float32 on CPU."""
    return device.type == "cuda" if setting is None else bool(setting)
