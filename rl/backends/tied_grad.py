"""One gradient buffer for tied input/output embeddings on the fused-loss path.

With tied embeddings the LM head's weight gradient (a [V, H] tensor the chunked loss accumulates) and the input
embedding's (another dense [V, H] tensor from the lookup's backward) would exist together before autograd adds
them: at Qwen2's vocabulary and hidden 1,024 that is 593 MiB each in fp32. Here the head's gradient is handed, as
it arrives, to the embedding lookup's backward, which adds the lookup's rows into it in place and returns it as
the weight's whole gradient; the head's own edge returns none. Same sum, one buffer.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn


class _Slot:
    """The head's weight gradient between the two backward calls (the head's runs first: the lookup feeds it)."""

    grad: Tensor | None = None
    tied = False


class _HandOff(torch.autograd.Function):
    """The weight as the head sees it; its backward parks the gradient in the slot instead of returning it."""

    @staticmethod
    def forward(ctx, weight: Tensor, slot: _Slot) -> Tensor:
        ctx.slot = slot
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        slot = ctx.slot
        slot.grad = grad if slot.grad is None else slot.grad.add_(grad)
        return None, None


class _Lookup(torch.autograd.Function):
    """`F.embedding(ids, weight)` whose weight gradient is the slot's buffer plus the looked-up rows' gradients."""

    @staticmethod
    def forward(ctx, weight: Tensor, ids: Tensor, slot: _Slot, padding_idx: int | None) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.slot, ctx.padding_idx, ctx.shape = slot, padding_idx, weight.shape
        return nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (ids,) = ctx.saved_tensors
        slot, rows = ctx.slot, grad_out.reshape(-1, ctx.shape[1])
        flat = ids.reshape(-1)
        if ctx.padding_idx is not None:  # nn.Embedding gives the padding row no gradient
            keep = flat != ctx.padding_idx
            flat, rows = flat[keep], rows[keep]
        total, slot.grad = slot.grad, None
        if total is None:  # the head was not part of this backward
            total = rows.new_zeros(ctx.shape)
        return total.index_add_(0, flat, rows.to(total.dtype)), None, None, None


def _plain_embedding(module: nn.Module | None) -> bool:
    return (isinstance(module, nn.Embedding) and module.max_norm is None and not module.scale_grad_by_freq
            and not module.sparse)


@contextlib.contextmanager
def shared_tied_grad(embedding: nn.Module | None, head: nn.Module):
    """Yields `route(weight)`: what the head should use as its weight while the block runs. When `embedding` is a
    plain `nn.Embedding` whose weight is the head's (the same parameter, as FSDP, FSDP2 and ZeRO present tied
    ones once gathered; checked at the lookup, after their forward hooks ran), the lookup runs through `_Lookup`
    and `route` through `_HandOff`; otherwise both are left alone."""
    if not _plain_embedding(embedding):
        yield lambda w: w
        return
    slot, plain = _Slot(), embedding.forward

    def lookup(ids: Tensor) -> Tensor:
        slot.tied = embedding.weight is head.weight
        if not slot.tied:
            return plain(ids)
        return _Lookup.apply(embedding.weight, ids, slot, embedding.padding_idx)

    embedding.forward = lookup
    try:
        yield lambda w: _HandOff.apply(w, slot) if slot.tied else w
    finally:
        del embedding.forward
