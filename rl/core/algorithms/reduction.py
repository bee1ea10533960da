"""Loss reductions normalized over the whole mini-batch, registered by name in `LOSS_REDUCTIONS`.

A mini-batch (one optimizer step) is split into micro-batches and across data-parallel (DP) ranks. Each
micro-batch's loss is ``(its share of the mini-batch numerator) / (mini-batch denominator)``, where the denominator
is computed ONCE for the whole mini-batch (`mini_batch_normalizer` or `LossNormalizer.from_counts`). Summing the
micro-batch losses, or their gradients, over micro-batches and ranks therefore gives exactly the mini-batch loss
and gradient, whatever the split. Two rules follow for backends:

- accumulate micro-batch gradients by plain summation: never divide by the number of micro-batches;
- DP gradient all-reduce: a SUM needs nothing; an AVERAGE (DDP / FSDP / DeepSpeed / Megatron default) is undone by
  building the normalizer with ``dp_world_size`` = number of DP ranks, which `compute_policy_loss` multiplies into
  the loss (not into the metrics).

Each sequence must sit entirely inside one micro-batch (the planner guarantees it). A sequence "counts" when it has
at least one token in the loss mask.

Reductions (per micro-batch; `mask` is the loss mask, `seq_ids` as in `segments.py`):

- ``token_mean``: sum of token losses / total loss tokens in the mini-batch.
- ``sequence_mean``: sum over sequences of (the sequence's mean token loss) / number of sequences in the mini-batch.
- ``seq_mean_token_sum_norm`` (Dr. GRPO): sum of token losses / (number of sequences * max_generate_length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rl.core.algorithms.segments import count_segments, resolve_seq_ids, segment_masked_mean, segment_sum
from rl.core.registry import Registry


@dataclass(frozen=True)
class LossReduction:
    """A reduction: `reduce(per_token_loss, mask, denominator, seq_ids, num_sequences)` and its mini-batch
    `denominator(num_tokens, num_sequences, max_generate_length)` rule. Calling it calls `reduce`."""

    name: str
    reduce: Callable[..., Tensor]
    denominator: Callable[[float, float, int | None], float]

    def __call__(
        self,
        per_token_loss: Tensor,
        mask: Tensor,
        denominator: float,
        seq_ids: Tensor | None = None,
        num_sequences: int | None = None,
    ) -> Tensor:
        return self.reduce(per_token_loss, mask, denominator, seq_ids, num_sequences)


LOSS_REDUCTIONS: Registry[LossReduction] = Registry("loss reduction")


def _register(name: str, denominator: Callable[[float, float, int | None], float]):
    def add(reduce: Callable[..., Tensor]) -> Callable[..., Tensor]:
        LOSS_REDUCTIONS.register(name)(LossReduction(name, reduce, denominator))
        return reduce

    return add


def masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    """Sum of `values` where `mask` is set; masked-out entries (even inf/nan) contribute exactly zero."""
    return torch.where(mask.bool(), values, 0.0).sum()


def _dr_grpo_denominator(num_tokens: float, num_sequences: float, max_generate_length: int | None) -> float:
    if max_generate_length is None or max_generate_length <= 0:
        raise ValueError(
            "loss reduction 'seq_mean_token_sum_norm' needs a positive max_generate_length "
            f"(generator.max_generate_length), got {max_generate_length}"
        )
    return float(num_sequences) * float(max_generate_length)


@_register("token_mean", lambda tokens, sequences, max_len: float(tokens))
def token_mean(per_token_loss, mask, denominator, seq_ids=None, num_sequences=None):
    """Sum of the micro-batch's token losses / mini-batch loss-token count."""
    return masked_sum(per_token_loss, mask) / denominator


@_register("sequence_mean", lambda tokens, sequences, max_len: float(sequences))
def sequence_mean(per_token_loss, mask, denominator, seq_ids=None, num_sequences=None):
    """Sum over the micro-batch's sequences of their mean token loss / mini-batch sequence count."""
    ids = resolve_seq_ids(per_token_loss, seq_ids)
    means = segment_masked_mean(per_token_loss, mask, ids, count_segments(ids, num_sequences))
    return means.sum() / denominator


@_register("seq_mean_token_sum_norm", _dr_grpo_denominator)
def seq_mean_token_sum_norm(per_token_loss, mask, denominator, seq_ids=None, num_sequences=None):
    """Sum of the micro-batch's token losses / (mini-batch sequence count * max_generate_length)."""
    return masked_sum(per_token_loss, mask) / denominator


@dataclass(frozen=True)
class LossNormalizer:
    """Mini-batch constants shared by all its micro-batches.

    `denominator` divides the reduced loss; `num_tokens` divides token-level metrics (clip fractions);
    `dp_world_size` multiplies the loss to undo a gradient AVERAGE across DP ranks (1 when gradients are summed).
    """

    reduction: str
    denominator: float
    num_tokens: float
    num_sequences: float
    dp_world_size: int = 1

    @classmethod
    def from_counts(
        cls,
        reduction: str,
        num_tokens: float,
        num_sequences: float,
        *,
        max_generate_length: int | None = None,
        dp_world_size: int = 1,
    ) -> LossNormalizer:
        """From mini-batch totals: loss tokens and sequences with at least one loss token (e.g. summed over DP
        ranks with an all-reduce). An empty mini-batch gets denominators of 1 (its loss is 0 anyway)."""
        if dp_world_size < 1:
            raise ValueError(f"dp_world_size must be >= 1, got {dp_world_size}")
        denominator = LOSS_REDUCTIONS.get(reduction).denominator(num_tokens, num_sequences, max_generate_length)
        return cls(
            reduction, max(denominator, 1.0), max(float(num_tokens), 1.0), float(num_sequences), int(dp_world_size)
        )


def loss_counts(loss_mask: Tensor, seq_ids: Tensor | None = None, num_sequences: int | None = None) -> tuple[int, int]:
    """(loss tokens, sequences with at least one loss token) in `loss_mask` ([B, T], or flat with seq_ids)."""
    ids = resolve_seq_ids(loss_mask, seq_ids)
    weights = loss_mask.bool().to(torch.float64)
    per_sequence = segment_sum(weights, ids, count_segments(ids, num_sequences))
    return int(weights.sum().item()), int((per_sequence > 0).sum().item())


def mini_batch_normalizer(
    reduction: str,
    loss_mask: Tensor,
    *,
    seq_ids: Tensor | None = None,
    num_sequences: int | None = None,
    max_generate_length: int | None = None,
    dp_world_size: int = 1,
) -> LossNormalizer:
    """The normalizer of a mini-batch, from the loss mask of the WHOLE mini-batch (all micro-batches, all ranks)."""
    tokens, sequences = loss_counts(loss_mask, seq_ids, num_sequences)
    return LossNormalizer.from_counts(
        reduction, tokens, sequences, max_generate_length=max_generate_length, dp_world_size=dp_world_size
    )
