"""Per-token log-probabilities (and entropy) of target tokens from a causal LM's logits.

Both go through the kernel dispatch (`rl.kernels.ops`), chosen by `trainer.kernels` (auto | torch | triton | cuda):
one pass over the vocabulary, no full fp32 log-softmax.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl.kernels import ops


def token_logprobs_and_entropy(logits: Tensor, targets: Tensor, temperature: float = 1.0, kernels: str = "auto",
                               with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """(log softmax(logits / T)[target], entropy of softmax(logits / T) or None) per row, fp32: [N, V], [N] -> [N],
    [N]; `with_entropy=False` spares the entropy's work where the implementation can."""
    return ops.token_logprobs_entropy(logits, targets, temperature, kernels=kernels, with_entropy=with_entropy)


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0, kernels: str = "auto") -> Tensor:
    """log softmax(logits / T)[target] per row, computed in fp32: [N, V], [N] -> [N]."""
    return token_logprobs_and_entropy(logits, targets, temperature, kernels, with_entropy=False)[0]


def token_entropy(logits: Tensor, temperature: float = 1.0, kernels: str = "auto") -> Tensor:
    """Entropy of softmax(logits / T) per row, fp32: [N, V] -> [N]."""
    targets = logits.new_zeros(logits.shape[0], dtype=torch.long)
    return token_logprobs_and_entropy(logits, targets, temperature, kernels)[1]

