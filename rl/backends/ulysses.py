"""Ulysses sequence parallelism for Hugging Face models (`trainer.policy.sequence_parallel_size` = N, fsdp/fsdp2).

The N ranks of a sequence-parallel group get the same packed micro-batch and each runs the model over 1/N of its
tokens (a contiguous slice of the row, padded to a multiple of N; sequences cross the slices freely). Everything but
attention is per token, so it runs on the slice as it is, with the slice's own position ids (RoPE stays right).
Attention needs whole sequences: an all-to-all turns [local tokens, all heads] into [all tokens, heads / N], the
packed attention (sdpa_varlen or flash-attention) runs per sequence over the whole row with its `cu_seqlens`, and a
second all-to-all turns the result back (DeepSpeed-Ulysses). KV heads fewer than N (grouped-query attention) are
repeated to the query heads first.

Token logprobs come back to every rank of the group whole: each rank scores the positions of its slice (their
targets may sit on the next rank's slice: the whole row is on every rank), and a sum over the group, whose backward
hands each rank the gradient as it is, assembles them. Every rank then computes the same loss; the gradient of a
weight is the sum of what the group's ranks computed through their slices, hence `gradient_scale`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

_PREFIX = "ulysses_"
_GROUPS: dict[tuple[int, int], object] = {}


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's sequence-parallel group: `size` consecutive ranks, this one at `rank` in it."""

    size: int
    rank: int
    group: object  # torch.distributed ProcessGroup

    def slice(self, length: int) -> tuple[int, int]:
        """[start, end) of this rank's tokens in a row of `length` (a multiple of size)."""
        per = length // self.size
        return self.rank * per, (self.rank + 1) * per


def sequence_parallel(size: int, world_rank: int, world_size: int) -> SequenceParallel | None:
    """The group of ranks [k * size, (k + 1) * size) holding `world_rank` (collective the first time: every rank
    creates every group); None for size 1."""
    if size <= 1:
        return None
    if world_size % size:
        raise ValueError(f"trainer.policy.sequence_parallel_size: {size} does not divide the {world_size} workers")
    key = (size, world_size)
    if key not in _GROUPS:
        groups = [dist.new_group(list(range(k, k + size))) for k in range(0, world_size, size)]
        _GROUPS[key] = groups
    return SequenceParallel(size=size, rank=world_rank % size, group=_GROUPS[key][world_rank // size])


class _AllToAll(torch.autograd.Function):
    """x [..., split over `scatter_dim`] -> the pieces of every rank along `gather_dim`; backward the inverse."""

    @staticmethod
    def forward(ctx, x: Tensor, group, scatter_dim: int, gather_dim: int) -> Tensor:
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad: Tensor):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, ctx.group, gather_dim, scatter_dim), None, None, None


def _all_to_all(x: Tensor, group, scatter_dim: int, gather_dim: int) -> Tensor:
    size = dist.get_world_size(group)
    inputs = [piece.contiguous() for piece in x.chunk(size, dim=scatter_dim)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(size)]
    dist.all_to_all(outputs, inputs, group=group)
    return torch.cat(outputs, dim=gather_dim)


class _SumOverGroup(torch.autograd.Function):
    """Sum over the group; the gradient passes through unchanged (every rank computes the same loss from the sum,
    so each rank's part gets that loss's gradient once)."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


def sum_over_group(x: Tensor, sp: SequenceParallel) -> Tensor:
    return _SumOverGroup.apply(x, sp.group)


def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, **kwargs):
    """The transformers attention function `ulysses_<inner>`: query [1, H, t, D], key/value [1, Hkv, t, D] of this
    rank's t tokens -> ([1, t, H, D], None), the inner implementation run on all tokens and H / N heads."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    inner = ALL_ATTENTION_FUNCTIONS[module.config._attn_implementation.removeprefix(_PREFIX)]
    sp: SequenceParallel | None = getattr(module, "sequence_parallel", None)
    if sp is None:
        return inner(module, query, key, value, attention_mask, **kwargs)
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads % sp.size:  # grouped-query attention with fewer KV heads than ranks: repeat them
        key, value = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (key, value))
    # [1, H, t, D] -> [1, H / N, N * t, D]
    query, key, value = (_AllToAll.apply(t, sp.group, 1, 2) for t in (query, key, value))
    out, _ = inner(module, query, key, value, None, **kwargs)  # [1, N * t, H / N, D]
    return _AllToAll.apply(out, sp.group, 1, 2), None  # [1, t, H, D]


def register(inner: str) -> str:
    """Makes `attn_implementation="ulysses_<inner>"` known to transformers (the inner implementation's masks);
    returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    name = _PREFIX + inner
    AttentionInterface.register(name, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[inner])
    return name


def attach(model: nn.Module, sp: SequenceParallel) -> None:
    """Points every attention module of `model` at the group (what `attention` reads) and checks the head count."""
    from rl.backends.fsdp_config import head_problem
    from rl.backends.mesh import decoder_layers

    problem = head_problem(model.config, sp.size)
    if problem:
        raise ValueError(f"trainer.policy.sequence_parallel_size: {problem}")
    for layer in decoder_layers(model):
        layer.self_attn.sequence_parallel = sp


def gradient_scale(sp: SequenceParallel | None) -> int:
    """What a loss is multiplied by before backward: data-parallel gradient averaging divides by every rank, but the
    ranks of a group computed parts of one gradient, which add up."""
    return sp.size if sp is not None else 1

