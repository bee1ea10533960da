"""Splitting sequences into per-rank micro-batches (packed or padded) and gathering per-token results back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rl.core.packing import PackedBatch, pack_sequences, pad_sequences, plan_micro_batches, plan_padded_micro_batches
from rl.core.packing.builders import unpack_micro_batches


@dataclass(frozen=True)
class MicroBatching:
    """How a set of sequences becomes micro-batches: packed under a token budget, or padded by count."""

    packed: bool
    max_tokens: int
    micro_batch_size: int
    dp_size: int
    pad_token_id: int = 0

    def plan(self, lengths: Sequence[int]) -> list[list[list[int]]]:
        if self.packed:
            return plan_micro_batches(lengths, self.max_tokens, self.dp_size)
        return plan_padded_micro_batches(len(lengths), self.micro_batch_size, self.dp_size)

    def build(self, sequences: Sequence[dict[str, Tensor]], plan: list[list[list[int]]]) -> list[list[PackedBatch]]:
        """Per rank, its micro-batches; each records the original sequence indices for `gather`."""
        build = pack_sequences if self.packed else pad_sequences
        per_rank = []
        for rank_plan in plan:
            per_rank.append([build([sequences[i] for i in members], seq_index=members,
                                   pad_token_id=self.pad_token_id) if members else pack_sequences([])
                             for members in rank_plan])
        return per_rank

    def split(self, sequences: Sequence[dict[str, Tensor]]) -> list[list[PackedBatch]]:
        return self.build(sequences, self.plan([len(s["input_ids"]) for s in sequences]))


def gather(batches: list[list[PackedBatch]], results: list[list[Tensor]], num_sequences: int) -> list[Tensor]:
    """Per-token results of every micro-batch of every rank, back to one tensor per sequence in original order."""
    flat_batches = [batch for rank_batches in batches for batch in rank_batches]
    flat_results = [values for rank_results in results for values in rank_results]
    pieces = unpack_micro_batches(flat_batches, flat_results)
    if len(pieces) != num_sequences:
        raise RuntimeError(f"micro-batches held {len(pieces)} sequences, expected {num_sequences}")
    return pieces


def attach(sequences: list[dict[str, Tensor]], name: str, values: list[Tensor]) -> None:
    """Stores one per-token tensor per sequence under `name`."""
    for sequence, value in zip(sequences, values, strict=True):
        sequence[name] = value.detach().to(torch.float32)
