"""One gradient buffer for tied input/output embeddings on the fused-loss path.

With tied embeddings the LM head's weight gradient (a [V, H] tensor the chunked loss accumulates) and the input
embedding's (another dense [V, H] tensor from the lookup's backward) would exist together before autograd adds
them: at Qwen2's vocabulary and hidden 1,024 that is 593 MiB each in fp32. Here the head's gradient is handed, as
it arrives, to the embedding lookup's backward, which adds the lookup's rows into it in place and returns it as
the weight's whole gradient; the head's own edge returns none. Same sum, one buffer.

With `defer_head_grad` the head does not even compute its weight gradient in its own backward: the chunked loss
hands over a function that adds it (`rl.kernels.autograd.weight_grad_later`, one more matmul per chunk), and the
lookup's backward, the last of the step, runs it into the buffer. The [V, H] gradient then never coexists with the
body's activations (FSDP2 keeps the gathered tied weight all along, so there it decides the peak).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn


class _Slot:
    """The head's weight gradient between the two backward calls (the head's runs first: the lookup feeds it)."""

    grad: Tensor | None = None
    tied = False

    def __init__(self):
        self.later: list = []  # the head's deferred gradients: add_to(buffer) functions

    def defer(self, add_to) -> None:
        self.later.append(add_to)


class _HandOff(torch.autograd.Function):
    """The weight as the head sees it; its backward parks the gradient in the slot instead of returning it."""

    @staticmethod
    def forward(ctx, weight: Tensor, slot: _Slot) -> Tensor:
        ctx.slot = slot
        ctx.set_materialize_grads(False)  # a deferred head returns no gradient: no [V, H] zeros either
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor | None):
        slot = ctx.slot
        if grad is not None:
            slot.grad = grad if slot.grad is None else slot.grad.add_(grad)
        return None, None


class _Lookup(torch.autograd.Function):
    """`F.embedding(ids, weight)` whose weight gradient is the slot's buffer plus the looked-up rows' gradients."""

    @staticmethod
    def forward(ctx, weight: Tensor, ids: Tensor, slot: _Slot, padding_idx: int | None) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.slot, ctx.padding_idx, ctx.shape, ctx.dtype = slot, padding_idx, weight.shape, weight.dtype
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
        later, slot.later = slot.later, []
        if later:  # the head's deferred gradient, accumulated in fp32 like the head's own
            buffer = rows.new_zeros(ctx.shape, dtype=torch.float32) if total is None else total.float()
            for add_to in later:
                buffer = add_to(buffer)
            total = buffer.to(ctx.dtype)
        if total is None:  # the head was not part of this backward
            total = rows.new_zeros(ctx.shape, dtype=ctx.dtype)
        return total.index_add_(0, flat, rows.to(total.dtype)), None, None, None


def _plain_embedding(module: nn.Module | None) -> bool:
    return (isinstance(module, nn.Embedding) and module.max_norm is None and not module.scale_grad_by_freq
            and not module.sparse)


class Route:
    """What the head uses while the block runs: `route(weight)` is its weight, `sink()` where its chunked loss
    should hand a deferred weight gradient (None: compute it in place, as usual)."""

    def __init__(self, slot: _Slot | None = None, defer: bool = False):
        self.slot, self.deferring = slot, defer

    def __call__(self, weight: Tensor) -> Tensor:
        return _HandOff.apply(weight, self.slot) if self.slot is not None and self.slot.tied else weight

    def sink(self):
        tied = self.slot is not None and self.slot.tied
        return self.slot.defer if tied and self.deferring else None


@contextlib.contextmanager
def shared_tied_grad(embedding: nn.Module | None, head: nn.Module, defer_head_grad: bool = False):
    """Yields a `Route` for the head. When `embedding` is a plain `nn.Embedding` whose weight is the head's (the
    same parameter, as FSDP, FSDP2 and ZeRO present tied ones once gathered; checked at the lookup, after their
    forward hooks ran), the lookup runs through `_Lookup` and the head's weight through `_HandOff`, and with
    `defer_head_grad` the head's weight gradient is computed at the lookup's backward; otherwise both are left
    alone."""
    if not _plain_embedding(embedding):
        yield Route()
        return
    slot, plain = _Slot(), embedding.forward

    def lookup(ids: Tensor) -> Tensor:
        slot.tied = embedding.weight is head.weight
        if not slot.tied:
            return plain(ids)
        return _Lookup.apply(embedding.weight, ids, slot, embedding.padding_idx)

    embedding.forward = lookup
    try:
        yield Route(slot, defer_head_grad)
    finally:
        del embedding.forward
