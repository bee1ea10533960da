"""Random packed batches and loss settings shared by the kernel tests (empty and length-1 sequences included)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.core.algorithms import LossSettings, compute_policy_loss
from rl.kernels.reference import cu_seqlens_from_lengths

LENGTHS = [3, 0, 1, 7, 1, 0, 5]


@dataclass
class Batch:
    lengths: torch.Tensor
    cu_seqlens: torch.Tensor
    seq_ids: torch.Tensor
    logits: torch.Tensor
    targets: torch.Tensor
    old: torch.Tensor
    adv: torch.Tensor
    ref: torch.Tensor
    mask: torch.Tensor

    @property
    def num_sequences(self) -> int:
        return self.lengths.numel()


def packed_batch(lengths=LENGTHS, vocab=50, dtype=torch.float32, device="cpu", seed=0, scale=2.0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lengths_t = torch.tensor(lengths, dtype=torch.int32)
    n = int(lengths_t.sum())
    logits = (torch.randn(n, vocab, generator=g) * scale).to(dtype)
    targets = torch.randint(0, vocab, (n,), generator=g)
    # old/ref near the current logprobs so ratios land on both sides of the clip range
    base = torch.log_softmax(logits.float(), -1).gather(1, targets[:, None]).squeeze(1)
    old = base + 0.4 * torch.randn(n, generator=g)
    ref = base + 0.4 * torch.randn(n, generator=g)
    adv = torch.randn(n, generator=g)
    mask = torch.rand(n, generator=g) > 0.25
    seq_ids = torch.repeat_interleave(torch.arange(len(lengths)), lengths_t.long())
    to = lambda t: t.to(device)  # noqa: E731
    return Batch(
        to(lengths_t),
        to(cu_seqlens_from_lengths(lengths_t)),
        to(seq_ids),
        to(logits),
        to(targets),
        to(old),
        to(adv),
        to(ref),
        to(mask),
    )


SETTINGS = {
    "regular-token_mean": LossSettings(eps_clip_low=0.2, eps_clip_high=0.28),
    "dual_clip-seq_mean-kl_k3-entropy": LossSettings(
        policy_loss_type="dual_clip",
        loss_reduction="sequence_mean",
        use_kl_loss=True,
        kl_loss_coef=0.1,
        kl_estimator_type="k3",
        use_entropy_loss=True,
        entropy_loss_coef=0.05,
        clip_ratio_c=2.0,
    ),
    "regular-drgrpo-kl_k2": LossSettings(
        loss_reduction="seq_mean_token_sum_norm",
        max_generate_length=16,
        use_kl_loss=True,
        kl_loss_coef=0.2,
        kl_estimator_type="k2",
    ),
    "cispo-token_mean-kl_k1": LossSettings(
        policy_loss_type="cispo", use_kl_loss=True, kl_estimator_type="k1", eps_clip_high=0.3
    ),
    "regular-kl_abs-entropy": LossSettings(use_kl_loss=True, kl_estimator_type="abs", use_entropy_loss=True),
}


def eager_logprobs(logits, targets, temperature=1.0):
    """The independent oracle: plain log_softmax, gather, and -sum p log p."""
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return logp.gather(1, targets[:, None].long()).squeeze(1), -(logp.exp() * logp).sum(-1)


def oracle_loss(settings, logprob, entropy, b, normalizer):
    """rl/core's compute_policy_loss on the packed batch `b` (the oracle of every fused loss)."""
    return compute_policy_loss(
        settings,
        logprob,
        b.old,
        b.adv,
        b.mask,
        normalizer,
        ref_logprobs=b.ref,
        entropy=entropy,
        seq_ids=b.seq_ids,
        num_sequences=b.num_sequences,
    )


class LaunchSpy:
    """Stands in for a @triton.jit kernel: runs it, keeping each launch's block sizes and warps."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launches.append({k: v for k, v in kwargs.items() if k.startswith("BLOCK_") or k == "num_warps"})
            return self.kernel[grid](*args, **kwargs)

        return run
