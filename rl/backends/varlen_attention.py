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
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rl.core.batch_invariant import causal_mask

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


class _TakeRows(torch.autograd.Function):
    """`x.index_select(0, index)` for an index without repeats, whose gradient is a plain copy back into those rows
    (or, given the inverse of a permutation `index`, a gather) instead of the scatter-add that indexing's backward
    runs for indices that might repeat."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, inverse: Tensor | None = None) -> Tensor:
        ctx.save_for_backward(index, inverse)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        index, inverse = ctx.saved_tensors
        if inverse is not None:
            return grad.index_select(0, inverse), None, None
        return grad.new_zeros(ctx.rows, *grad.shape[1:]).index_copy_(0, index, grad), None, None


class _PutRows(torch.autograd.Function):
    """A `rows`-row tensor of zeros with `x` copied into the rows `index` (no repeats); gradient: those rows."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, rows: int) -> Tensor:
        ctx.save_for_backward(index)
        return x.new_zeros(rows, *x.shape[1:]).index_copy_(0, index, x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index), None, None


@dataclass(frozen=True)
class _Group:
    """`count` sequences padded to `width`. `slots`: their real tokens' rows in the flat [count * width] grid, and
    `key_mask` [count, 1, 1, width]: which keys are real; both None when every member has length `width` (the grid
    is then a plain view of the tokens)."""

    count: int
    width: int
    tokens: int
    slots: Tensor | None
    key_mask: Tensor | None

    @property
    def grid(self) -> int:
        return self.count * self.width


@functools.lru_cache(maxsize=16)
def _plan(starts: tuple[int, ...], lengths: tuple[int, ...], device: torch.device
          ) -> tuple[list[_Group], Tensor, Tensor]:
    """The groups; `order`, the packed row's token positions in group order (member by member); its inverse."""
    groups, order = [], []
    for members in length_groups(lengths):
        width = lengths[members[0]]
        valid = torch.arange(width)[None] < torch.tensor([lengths[i] for i in members])[:, None]
        full = bool(valid.all())
        groups.append(_Group(len(members), width, int(valid.sum()),
                             None if full else valid.reshape(-1).nonzero().squeeze(-1).to(device),
                             None if full else valid[:, None, None, :].to(device)))
        order += [torch.arange(starts[i], starts[i] + lengths[i]) for i in members]
    order = torch.cat(order)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return groups, order.to(device), inverse.to(device)


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    """[.., Hkv, D] -> [.., Hkv * groups, D] (grouped-query attention)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=-2)


def varlen_sdpa(query: Tensor, key: Tensor, value: Tensor, cu_seqlens: Tensor, scale: float | None = None,
                dropout: float = 0.0, sliding_window: int | None = None) -> Tensor:
    """Causal attention of every sequence within itself. query [N, H, D], key/value [N, Hkv, D], cu_seqlens [S+1]
    covering all N tokens -> [N, H, D]."""
    bounds = cu_seqlens.tolist()
    starts, lengths = tuple(bounds[:-1]), tuple(b - a for a, b in itertools.pairwise(bounds))
    groups, order, inverse = _plan(starts, lengths, query.device)
    key = _repeat_kv(key, query.shape[1] // key.shape[1])
    value = _repeat_kv(value, query.shape[1] // value.shape[1])
    sorted_qkv = [_TakeRows.apply(t, order, inverse) for t in (query, key, value)]  # tokens in group order
    pieces, offset = [], 0
    for group in groups:
        rows = [t[offset:offset + group.tokens] for t in sorted_qkv]
        offset += group.tokens
        if group.slots is not None:
            rows = [_PutRows.apply(r, group.slots, group.grid) for r in rows]
        q, k, v = (r.view(group.count, group.width, *r.shape[1:]).transpose(1, 2) for r in rows)  # [count, H, L, D]
        mask = None
        if group.key_mask is not None or (sliding_window is not None and sliding_window < group.width):
            mask = causal_mask(group.width, group.width, query.device, sliding_window)[None, None]
            if group.key_mask is not None:  # keys past a member's length are padding
                mask = mask & group.key_mask
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, scale=scale)
        out = out.transpose(1, 2).reshape(group.grid, out.shape[1], out.shape[3])  # [count * L, H, D]
        pieces.append(out if group.slots is None else _TakeRows.apply(out, group.slots))
    return _TakeRows.apply(torch.cat(pieces), inverse, order)


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
