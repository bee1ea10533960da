"""Runs a Hugging Face causal LM over a `PackedBatch` and returns per-token logprobs aligned with target tokens.

Packed batches go in as one row whose position ids restart at every sequence, with the sequence boundaries as
flash-attention's packing kwargs (`cu_seq_lens_q`...): flash attention and `sdpa_varlen` (rl.backends.varlen_attention)
attend within each sequence at its own cost; plain sdpa/eager fall back on the block-diagonal causal mask transformers
derives from the position resets. No token attends across a sequence boundary either way. Padded batches go in as
[S, L] rows with an attention mask.

A vision-language model also gets the batch's images and its multimodal rotary positions (`rl.backends.multimodal`).

Only positions that predict a loss token go through the LM head (transformers' `logits_to_keep` with an index
tensor, as TRL and veRL do): prompt positions cost no `[tokens, vocab]` logits, log-softmax or LM-head backward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rl.backends.logits import token_entropy, token_logprobs_and_entropy
from rl.backends.multimodal import multimodal_kwargs, takes_images
from rl.backends.tied_grad import shared_tied_grad
from rl.backends.ulysses import SequenceParallel, sum_over_group
from rl.backends.varlen_attention import packing_kwargs
from rl.core import batch_invariant
from rl.core.packing import PackedBatch


@dataclass(frozen=True)
class ScoredLogits:
    """Logits of the positions that predict loss tokens: row i predicts the flat token `targets_at[i]`."""

    logits: Tensor  # [M, V]
    targets_at: Tensor  # [M] long: flat positions (in the batch) of the predicted tokens


def scored_inputs(batch: PackedBatch, sp: SequenceParallel | None = None) -> tuple[dict, Tensor]:
    """(model kwargs, targets_at): the whole batch in, the LM head over the positions before each loss-mask token.
    Packed: those flat positions. Padded: the columns that precede a loss token in any row (a column's logits are
    computed for every row, so rows with shorter prompts pay for a few extra positions). With sequence parallelism
    this rank's slice of the packed row goes in (`rl.backends.ulysses`), its own scored positions out."""
    predicts = batch.loss_mask.roll(-1, dims=0)  # position t predicts token t + 1; slot starts are never loss tokens
    if sp is not None:
        return _slice_inputs(batch, predicts.nonzero().squeeze(-1), sp)
    if batch.padded:
        columns = batch.as_padded(predicts).any(0).nonzero().squeeze(-1)
        rows = torch.arange(batch.num_sequences, device=columns.device)[:, None] * batch.padded_length
        kwargs = dict(input_ids=batch.as_padded(), attention_mask=batch.attention_mask().long(),
                      position_ids=batch.as_padded(batch.position_ids), use_cache=False, logits_to_keep=columns)
        return kwargs, (rows + columns[None] + 1).reshape(-1)
    positions = predicts.nonzero().squeeze(-1)
    kwargs = dict(input_ids=batch.input_ids[None], position_ids=batch.position_ids[None], use_cache=False,
                  logits_to_keep=positions, **packing_kwargs(batch.cu_seqlens))
    return kwargs, positions + 1


def _slice_inputs(batch: PackedBatch, positions: Tensor, sp: SequenceParallel) -> tuple[dict, Tensor]:
    """This rank's contiguous slice of the packed row, padded to a multiple of the group size with one more
    sequence of pad tokens; the boundaries (`cu_seqlens`) stay those of the whole row, for attention."""
    if batch.padded:
        raise ValueError("trainer.policy.sequence_parallel_size > 1 needs packed batches (trainer.use_sample_packing)")
    length = -(-batch.num_tokens // sp.size) * sp.size
    pad = length - batch.num_tokens
    ids = torch.cat([batch.input_ids, batch.input_ids.new_zeros(pad)])
    position_ids = torch.cat([batch.position_ids, torch.arange(pad, device=batch.position_ids.device)])
    cu_seqlens = batch.cu_seqlens
    if pad:
        cu_seqlens = torch.cat([cu_seqlens, cu_seqlens.new_tensor([length])])
    start, end = sp.slice(length)
    mine = positions[(positions >= start) & (positions < end)]
    kwargs = dict(input_ids=ids[None, start:end], position_ids=position_ids[None, start:end], use_cache=False,
                  logits_to_keep=mine - start, **packing_kwargs(cu_seqlens))
    return kwargs, mine + 1


def model_inputs(model: nn.Module, batch: PackedBatch, sp: SequenceParallel | None = None) -> tuple[dict, Tensor]:
    """`scored_inputs`, with a vision-language model's images and positions added."""
    kwargs, targets_at = scored_inputs(batch, sp)
    inner = _unwrapped(model)
    if takes_images(inner):
        if sp is not None:
            raise ValueError("trainer.policy.sequence_parallel_size > 1 does not split a vision-language model's "
                             "images and positions; set it to 1 for this model")
        kwargs.update(multimodal_kwargs(inner, batch))
    elif batch.has_images:
        raise ValueError(f"the batch has images, but {type(inner).__name__} is a text-only model")
    return kwargs, targets_at


def scored_logits(model: nn.Module, batch: PackedBatch, sp: SequenceParallel | None = None) -> ScoredLogits:
    """The logits of the positions that predict loss tokens (see `scored_inputs`)."""
    kwargs, targets_at = model_inputs(model, batch, sp)
    logits = model(**kwargs).logits
    return ScoredLogits(logits.reshape(-1, logits.shape[-1]), targets_at)


def _unwrapped(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a DeepSpeed engine or FSDP wrapper (its own config and submodules, not a
    wrapper's that forwards some of them)."""
    from transformers import PreTrainedModel

    while not isinstance(model, PreTrainedModel) and hasattr(model, "module"):
        model = model.module
    return model


def output_head(model: nn.Module) -> nn.Module:
    """The LM head of a (possibly wrapped: DeepSpeed engine, FSDP) Hugging Face causal LM; bias-free only."""
    inner = _unwrapped(model)
    head = inner.get_output_embeddings()
    if not isinstance(getattr(head, "weight", None), Tensor) or getattr(head, "bias", None) is not None:
        raise ValueError("trainer.policy.use_fused_kernels needs a bias-free linear LM head; set it to false for "
                         f"this model ({type(inner).__name__})")
    return head


@contextlib.contextmanager
def _head_replaced(head: nn.Module, fn, route):
    """The head's forward is `fn(hidden [..., H], weight)` while the block runs. The wrapped model's own forward
    still calls it, inside FSDP's / ZeRO-3's hooks, so the weight it receives is the gathered one and the
    gradient `fn`'s output carries reaches the sharded parameter through the same path as the logits path's.
    `route` is `tied_grad.shared_tied_grad`'s: tied embeddings share one gradient buffer."""
    head.forward = lambda hidden: fn(hidden.reshape(-1, hidden.shape[-1]), route(head.weight))
    try:
        yield
    finally:
        del head.forward


def head_call(model: nn.Module, batch: PackedBatch, fn, defer_head_grad: bool = False):
    """What `fn(hidden [M, H], lm_head_weight, targets_at [M], weight_grad_sink)` returned: the model body over the
    batch, then `fn` in place of the LM head over the scored positions (those of `scored_logits`).
    `weight_grad_sink` is None unless `defer_head_grad` and the embeddings are tied (see `tied_grad`)."""
    kwargs, targets_at = model_inputs(model, batch)
    head = output_head(model)
    embedding = _unwrapped(model).get_input_embeddings()
    with (shared_tied_grad(embedding, head, defer_head_grad) as route,
          _head_replaced(head, lambda hidden, weight: fn(hidden, weight, targets_at, route.sink()), route)):
        return model(**kwargs).logits


def batch_logprobs(model: nn.Module, batch: PackedBatch, temperature: float, with_entropy: bool,
                   kernels: str = "auto", sp: SequenceParallel | None = None) -> tuple[Tensor, Tensor | None]:
    """(logprobs [N], entropy [N] or None), both aligned with the target token like the batch's loss_mask and
    computed where the loss mask is set (0 elsewhere, in padded batches on some more positions).
    `kernels` is trainer.kernels: which implementation of the token-logprob op runs (see rl.kernels.ops), or
    `batch_invariant` (`rl.core.batch_invariant`, trainer.exact_on_policy).
    With sequence parallelism every rank of the group gets the whole micro-batch's values."""
    if batch.num_tokens == 0:
        empty = batch.input_ids.new_zeros(0, dtype=next(model.parameters()).dtype)
        return empty.float(), (empty.float() if with_entropy else None)
    scored = scored_logits(model, batch, sp)
    targets = batch.input_ids[scored.targets_at]
    if kernels == batch_invariant.NAME:  # the engine's log-softmax, bit for bit; the entropy needs no such order
        logprobs = batch_invariant.token_logprobs(scored.logits, targets, temperature)
        entropy = token_entropy(scored.logits, temperature) if with_entropy else None
    else:
        logprobs, entropy = token_logprobs_and_entropy(scored.logits, targets, temperature, kernels, with_entropy)
    return (_spread(logprobs, scored.targets_at, batch, sp),
            _spread(entropy, scored.targets_at, batch, sp) if with_entropy else None)


def batch_values(model: nn.Module, batch: PackedBatch, sp: SequenceParallel | None = None) -> Tensor:
    """[N] values of a critic (a causal LM whose output head is `rl.backends.value_head`'s one-output head), aligned
    with the target token like the logprobs: entry t is the head's output at position t - 1, the state before
    token t; computed where the loss mask is set, 0 elsewhere."""
    if batch.num_tokens == 0:
        return batch.input_ids.new_zeros(0, dtype=torch.float32)
    scored = scored_logits(model, batch, sp)
    return _spread(scored.logits[:, 0].float(), scored.targets_at, batch, sp)


def _spread(values: Tensor, targets_at: Tensor, batch: PackedBatch, sp: SequenceParallel | None) -> Tensor:
    """Per-position values onto the batch's [N] tokens (every rank of a sequence-parallel group gets them all)."""
    whole = values.new_zeros(batch.num_tokens).index_put((targets_at,), values)
    return whole if sp is None else sum_over_group(whole, sp)
