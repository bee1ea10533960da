"""One small packed batch and one training step on a built backend, for tests that compare backends or settings."""

from __future__ import annotations

import torch

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.packing import pack_sequences


def small_batch():
    """Three packed sequences (6, 9 and 4 tokens), the first two tokens of each outside the loss."""
    g = torch.Generator().manual_seed(0)
    seqs = []
    for n in (6, 9, 4):
        mask = torch.arange(n) >= 2
        seqs.append({"input_ids": torch.randint(3, 20, (n,), generator=g), "loss_mask": mask,
                     "advantages": torch.randn(n, generator=g) * mask, "old_logprobs": torch.zeros(n)})
    return pack_sequences(seqs)


def train_step(backend) -> dict[str, float]:
    """Old logprobs from the backend, one GRPO loss without KL over `small_batch`, one optimizer step."""
    batch = small_batch()
    old, _ = backend.logprobs(batch)
    batch = batch.replace(old_logprobs=old)
    settings = LossSettings(use_kl_loss=False)
    normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), 3)
    backend.forward_backward(batch, settings, normalizer)
    return backend.optimizer_step()
