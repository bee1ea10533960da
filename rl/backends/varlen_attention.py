"""Packed (varlen) attention on PyTorch sdpa: each sequence of a packed row attends only to itself, at its own cost.

For a packed row of N tokens with no flash attention, transformers builds one N x N block-diagonal mask and sdpa
pays for all N² scores, however short the sequences are. Flash attention's varlen kernels avoid that on GPU; this is
the same idea on sdpa (CPU, or a GPU without flash-attn). The sequences, given by the `cu_seq_lens_q` keyword that
transformers forwards to the attention function (the flash-attention packing kwargs), are gathered into padded
[count, heads, length, dim] groups of similar length, run through sdpa with a causal mask, and scattered back to
the packed order. Registered with transformers as `sdpa_varlen`; a call without the packing kwargs (a padded batch,
generation) is transformers' own sdpa, and so is anything this path does not cover (attention sinks).
"""

from __future__ import annotations

import functools
import itertools

import torch
from torch import Tensor, nn

NAME = "sdpa_varlen"
PADDING_WASTE = 1.25
"""A group's padded score count (members x longest²) stays within this factor of its members' own Σ length²."""


def length_groups(lengths: tuple[int, ...]) -> list[list[int]]:
    """Sequence indices, longest first, cut into groups whose padded attention cost stays within PADDING_WASTE."""
    groups: list[list[int]] = []
    useful = 0
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        cost = lengths[i] ** 2
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] ** 2 <= PADDING_WASTE * (useful + cost):
            groups[-1].append(i)
            useful += cost
        else:
            groups.append([i])
            useful = cost
    return groups


@functools.lru_cache(maxsize=16)
def _group_indices(starts: tuple[int, ...], lengths: tuple[int, ...], device: torch.device):
    """Per group: the [count, L] flat index of each slot position (padding repeats the sequence's first token), the
    [count, L] validity mask or None when every member has length L; and the flat order of the valid outputs."""
    plan, order = [], []
    for members in length_groups(lengths):
        width = lengths[members[0]]
        offsets = torch.arange(width)
        count = torch.tensor([lengths[i] for i in members])[:, None]
        valid = offsets[None] < count
        index = torch.tensor([starts[i] for i in members])[:, None] + torch.where(valid, offsets[None], 0)
        order.append(index[valid])
        plan.append((index.to(device), None if bool(valid.all()) else valid.to(device)))
    inverse = torch.empty(sum(lengths), dtype=torch.long)
    inverse[torch.cat(order)] = torch.arange(sum(lengths))
    return plan, inverse.to(device)


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    """[.., Hkv, D] -> [.., Hkv * groups, D] (grouped-query attention)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=-2)


def varlen_sdpa(query: Tensor, key: Tensor, value: Tensor, cu_seqlens: Tensor, scale: float | None = None,
                dropout: float = 0.0, sliding_window: int | None = None) -> Tensor:
    """Causal attention of every sequence within itself. query [N, H, D], key/value [N, Hkv, D], cu_seqlens [S+1]
    covering all N tokens -> [N, H, D]."""
    bounds = cu_seqlens.tolist()
    starts, lengths = tuple(bounds[:-1]), tuple(b - a for a, b in itertools.pairwise(bounds))
    plan, inverse = _group_indices(starts, lengths, query.device)
    key = _repeat_kv(key, query.shape[1] // key.shape[1])
    value = _repeat_kv(value, query.shape[1] // value.shape[1])
    pieces = []
    for index, valid in plan:
        width = index.shape[1]
        q, k, v = (t[index].transpose(1, 2) for t in (query, key, value))  # [count, H, L, D]
        mask = None
        if valid is not None or (sliding_window is not None and sliding_window < width):
            positions = torch.arange(width, device=query.device)
            distance = positions[:, None] - positions[None, :]
            mask = distance >= 0
            if sliding_window is not None:
                mask = mask & (distance < sliding_window)
            mask = mask[None, None] if valid is None else mask[None, None] & valid[:, None, None, :]
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, scale=scale)
        out = out.transpose(1, 2)  # [count, L, H, D]
        pieces.append(out.reshape(-1, *out.shape[2:]) if valid is None else out[valid])
    return torch.cat(pieces)[inverse]


def sdpa_varlen_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                          attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          **kwargs) -> tuple[Tensor, None]:
    """transformers attention function: query [1, H, N, D], key/value [1, Hkv, N, D] -> ([1, N, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu_seqlens = kwargs.get("cu_seq_lens_q")
    packed = (cu_seqlens is not None and query.shape[0] == 1 and kwargs.get("s_aux") is None
              and getattr(module, "is_causal", True) and int(cu_seqlens[-1]) == query.shape[2])
    if not packed:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = varlen_sdpa(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), cu_seqlens,
                      scale=scaling, dropout=dropout, sliding_window=kwargs.get("sliding_window"))
    return out[None], None


def register() -> str:
    """Makes `attn_implementation="sdpa_varlen"` known to transformers (masks as for sdpa); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, sdpa_varlen_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME


def packing_kwargs(cu_seqlens: Tensor) -> dict:
    """The keywords that carry a packed row's sequence boundaries to the attention function (flash-attention's
    names, so flash_attention_2 takes them as they are)."""
    cu = cu_seqlens.to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
