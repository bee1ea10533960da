"""Segment (per-sequence) reductions over token tensors, vectorized with index_add instead of loops over sequences.

A *segment id* tensor has the shape of the token tensor it describes and holds, for every token, the position
(0..S-1) of the sequence the token belongs to. Two layouts are accepted everywhere:

- padded ``[B, T]`` tensors: ``seq_ids`` may be omitted and defaults to the row index;
- flat packed ``[N]`` tensors (``PackedBatch``): ``seq_ids`` is ``PackedBatch.token_seq_ids()``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def resolve_seq_ids(like: Tensor, seq_ids: Tensor | None) -> Tensor:
    """Per-token sequence ids for `like`: `seq_ids` when given, else the row index of a 2-D `like`."""
    if seq_ids is None:
        if like.dim() != 2:
            raise ValueError(
                f"seq_ids is required for a {like.dim()}-D token tensor of shape {tuple(like.shape)}; "
                "pass seq_ids (e.g. PackedBatch.token_seq_ids()) or use a padded [B, T] tensor"
            )
        rows = torch.arange(like.shape[0], device=like.device)
        return rows.unsqueeze(1).expand_as(like)
    if seq_ids.shape != like.shape:
        raise ValueError(f"seq_ids has shape {tuple(seq_ids.shape)} but the token tensor has {tuple(like.shape)}")
    return seq_ids


def count_segments(seq_ids: Tensor, num_sequences: int | None) -> int:
    """Number of segments: `num_sequences` when given (no host sync), else max id + 1."""
    if num_sequences is not None:
        return int(num_sequences)
    return int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0


def segment_sum(values: Tensor, seq_ids: Tensor, num_sequences: int) -> Tensor:
    """Sum of `values` per segment, shape [num_sequences]; differentiable w.r.t. `values`."""
    out = values.new_zeros(num_sequences)
    return out.index_add(0, seq_ids.reshape(-1).long(), values.reshape(-1))


def segment_masked_mean(values: Tensor, mask: Tensor, seq_ids: Tensor, num_sequences: int) -> Tensor:
    """Mean of `values` over each segment's masked tokens, shape [num_sequences]; 0 for segments with no token."""
    weights = mask.to(values.dtype)
    totals = segment_sum(torch.where(mask.bool(), values, 0.0), seq_ids, num_sequences)
    counts = segment_sum(weights, seq_ids, num_sequences)
    return totals / counts.clamp(min=1.0)
