"""RMSNorm for the local layer spec that also works with sequence parallelism.

megatron-core's local norm (`WrappedTorchNorm`) refuses `sequence_parallel`; with SP each TP rank normalizes its own
slice of the sequence, so the weight's gradient is partial per rank: it is marked `sequence_parallel`, and
megatron's `finalize_model_grads` sums such gradients over the TP group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    def __init__(self, config, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
