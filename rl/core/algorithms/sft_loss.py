"""The supervised (SFT) loss, assembled once for every backend like the policy's (`loss.py`).

Per token t of an assistant turn (the loss mask), with log pi(x_t | x_<t) the model's token logprob at temperature
1::

    loss = reduce(-log pi(x_t | x_<t))        (token_mean: sum over the mini-batch's assistant tokens / their count)

reduced over the mini-batch by the same `LossNormalizer` as the RL loss, so the gradient does not depend on the
micro-batch or data-parallel split (SkyRL's SFT trainer and NeMo RL's `NLLLoss` take the same token mean).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rl.core.algorithms.reduction import LOSS_REDUCTIONS, LossNormalizer


@dataclass(frozen=True)
class SupervisedLossSettings:
    """What a backend needs to know of a supervised loss (SFT, DPO): the reduction its normalizer is built for;
    `compute(logprobs, batch, normalizer)` gives (micro-batch loss, metric shares) from the token logprobs."""

    loss_reduction: str = "token_mean"
    max_generate_length: int | None = None  # only `seq_mean_token_sum_norm` reads it

    def compute(self, logprobs: Tensor, batch, normalizer: LossNormalizer) -> tuple[Tensor, dict[str, Tensor]]:
        raise NotImplementedError


@dataclass(frozen=True)
class SftLossSettings(SupervisedLossSettings):
    """`sft.loss_reduction` (token_mean by default, as the RL loss)."""

    def compute(self, logprobs: Tensor, batch, normalizer: LossNormalizer) -> tuple[Tensor, dict[str, Tensor]]:
        return compute_sft_loss(self, logprobs, batch.loss_mask, normalizer, seq_ids=batch.token_seq_ids(),
                                num_sequences=batch.num_sequences)


def compute_sft_loss(settings: SftLossSettings, logprobs: Tensor, loss_mask: Tensor, normalizer: LossNormalizer, *,
                     seq_ids: Tensor | None = None, num_sequences: int | None = None
                     ) -> tuple[Tensor, dict[str, Tensor]]:
    """Micro-batch loss ``reduce(-logprobs) * dp_world_size`` and its share of the mini-batch metrics:
    ``sft_loss`` (the reduction) and ``sft_tokens`` (this micro-batch's loss tokens)."""
    if loss_mask.shape != logprobs.shape:
        raise ValueError(f"loss_mask has shape {tuple(loss_mask.shape)} but logprobs has {tuple(logprobs.shape)}")
    if normalizer.reduction != settings.loss_reduction:
        raise ValueError(f"normalizer was built for '{normalizer.reduction}' but the SFT loss reduction is "
                         f"'{settings.loss_reduction}'")
    reduction = LOSS_REDUCTIONS.get(settings.loss_reduction)
    loss = reduction(-logprobs, loss_mask, normalizer.denominator, seq_ids, num_sequences)
    metrics = {"sft_loss": loss.detach(), "sft_tokens": loss_mask.sum().detach().float()}
    return loss * normalizer.dp_world_size, metrics
