"""Packing ops: right-padded ``[B, T, ...]`` <-> packed ``[N, ...]``, and the ``cu_seqlens`` / ``position_ids``
that describe a packed batch. Sequence b owns ``padded[b, :lengths[b]]`` and ``packed[cu[b]:cu[b + 1]]``."""

from __future__ import annotations

import torch
from torch import Tensor


def check_lengths(lengths: Tensor, max_len: int | None = None) -> None:
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D [B], got shape {tuple(lengths.shape)}")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError("lengths must be >= 0")
    if max_len is not None and lengths.numel() and int(lengths.max()) > max_len:
        raise ValueError(f"a length ({int(lengths.max())}) exceeds the padded width T={max_len}")


def cu_seqlens_from_lengths(lengths: Tensor) -> Tensor:
    """[B] lengths -> [B+1] int32 prefix sums starting at 0."""
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    out[1:] = torch.cumsum(lengths.to(torch.int64), 0).to(torch.int32)
    return out


def position_ids(cu_seqlens: Tensor) -> Tensor:
    """[N] long: 0, 1, ... restarting at every sequence start (N = cu_seqlens[-1])."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    total = int(cu_seqlens[-1]) if cu_seqlens.numel() else 0
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), lengths, output_size=total)
    return torch.arange(total, device=cu_seqlens.device) - starts


def _valid(lengths: Tensor, width: int) -> Tensor:
    return torch.arange(width, device=lengths.device)[None, :] < lengths.to(torch.int64)[:, None]


def pack(padded: Tensor, lengths: Tensor) -> Tensor:
    """Gather the first ``lengths[b]`` entries of each row of ``padded`` [B, T, ...] into [N, ...]."""
    check_lengths(lengths, padded.shape[1])
    return padded[_valid(lengths, padded.shape[1])]


def unpack(packed: Tensor, lengths: Tensor, width: int, pad_value: float = 0) -> Tensor:
    """Scatter packed [N, ...] back to [B, width, ...]; positions past each length hold ``pad_value``."""
    check_lengths(lengths, width)
    out = packed.new_full((lengths.numel(), width, *packed.shape[1:]), pad_value)
    out[_valid(lengths, width)] = packed
    return out
