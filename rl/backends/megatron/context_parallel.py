"""Context parallelism for the megatron backend (`megatron_config.context_parallel_size` = CP), on the local layer
spec: megatron-core's own CP path needs Transformer Engine's attention, so the split lives here and megatron sees
the CP ranks as data-parallel ones (its DDP reduces their gradients, the distributed optimizer shards over them).

Each packed micro-batch is padded to a multiple of CP (times TP with sequence parallelism) and every CP rank runs the
model over a contiguous 1/CP of the row; sequences cross the cuts freely. What needs more than the local tokens:
- attention: keys and values are all-gathered over the group (their gradients summed back), queries stay local
  and see their own sequence's keys up to their position in the whole row (`PackedDotProductAttention`);
- rotary embeddings: each token gets the embedding of its position in its sequence (a hook on the model's rotary
  module, fed the micro-batch's position ids);
- logprobs: each rank scores its own positions (targets from the whole row, which every rank has) and a sum over
  the group, whose backward passes each rank the gradient as it is, assembles the row; every rank then computes the
  same loss, and megatron's gradient average over the CP ranks is undone by scaling the loss by CP.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from rl.backends.ulysses import SequenceParallel, sum_over_group

_GROUPS: dict[tuple, dict[tuple[int, ...], object]] = {}


@dataclass(frozen=True)
class RowSlice:
    """What the attention of one CP rank needs about the whole row: its boundaries and where this slice starts."""

    group: SequenceParallel
    cu_seqlens: Tensor  # int32 [S + 1] of the whole (padded) row
    offset: int


def context_parallel(size: int) -> SequenceParallel | None:
    """This rank's CP group: `size` consecutive ranks of its megatron data-parallel group (collective: every rank
    creates every group); None for size 1."""
    if size <= 1:
        return None
    from megatron.core import parallel_state as ps

    mine = dist.get_process_group_ranks(ps.get_data_parallel_group())
    if len(mine) % size:
        raise ValueError(f"trainer.policy.megatron_config.context_parallel_size: {size} does not divide the "
                         f"data-parallel size {len(mine)}")
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, tuple(mine))
    layout = (size, tuple(sorted(set(everyone))))  # every data-parallel group
    if layout not in _GROUPS:  # the policy and the reference share them
        _GROUPS[layout] = {tuple(ranks[k:k + size]): dist.new_group(list(ranks[k:k + size]))
                           for ranks in layout[1] for k in range(0, len(ranks), size)}
    rank = dist.get_rank()
    members, group = next((m, g) for m, g in _GROUPS[layout].items() if rank in m)
    return SequenceParallel(size=size, rank=members.index(rank), group=group)


def local_inputs(ids: Tensor, pos: Tensor, params, cp: SequenceParallel):
    """The whole row's THD inputs (`batches.thd_inputs`, length a multiple of CP) -> this rank's slice: its ids and
    position ids, and packed-sequence parameters of one segment covering the slice (for megatron's rotary path),
    carrying the whole row (`RowSlice`) for the attention."""
    from megatron.core.packed_seq_params import PackedSeqParams

    start, end = cp.slice(ids.shape[1])
    local = end - start
    cu = torch.tensor([0, local], dtype=torch.int32, device=ids.device)
    sliced = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=local,
                             max_seqlen_kv=local)
    sliced.row = RowSlice(cp, params.cu_seqlens_q, start)
    return ids[:, start:end], pos[:, start:end], sliced


class _GatherRows(torch.autograd.Function):
    """Every rank's [t, ...] rows, in rank order; the gradient of this rank's rows is the sum over the group."""

    @staticmethod
    def forward(ctx, x: Tensor, cp: SequenceParallel) -> Tensor:
        ctx.cp = cp
        pieces = [torch.empty_like(x) for _ in range(cp.size)]
        dist.all_gather(pieces, x.contiguous(), group=cp.group)
        return torch.cat(pieces)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.cp.group)
        return grad.chunk(ctx.cp.size)[ctx.cp.rank], None


def gather_rows(x: Tensor, cp: SequenceParallel) -> Tensor:
    return _GatherRows.apply(x, cp)


def query_key_mask(row: RowSlice, local: int) -> Tensor:
    """[local, T] bool: a local query (at `row.offset + i` in the row) sees a key of its own sequence at or before
    its position."""
    total = int(row.cu_seqlens[-1])
    keys = torch.arange(total, device=row.cu_seqlens.device)
    queries = keys[row.offset:row.offset + local]
    bounds = row.cu_seqlens[1:].to(keys.dtype)
    same = torch.bucketize(queries, bounds, right=True)[:, None] == torch.bucketize(keys, bounds, right=True)[None]
    return same & (keys[None, :] <= queries[:, None])


def whole_row(values: Tensor, start: int, length: int, cp: SequenceParallel) -> Tensor:
    """This rank's [t] values placed at `start` in a [length] row, summed over the group (every rank fills its own
    part): the whole row on every rank."""
    row = torch.nn.functional.pad(values, (start, length - start - values.shape[0]))
    return sum_over_group(row, cp)


def positional_rotary(chunk: torch.nn.Module) -> None:
    """Makes the chunk's rotary module return, for a micro-batch, one embedding per local token: that of the
    token's position id (its position in its sequence), whatever slice of the row the rank holds."""
    rotary = getattr(chunk, "rotary_pos_emb", None)
    if rotary is None:
        return

    def take_positions(_module, args, kwargs):
        rotary.positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)

    def per_token(module, args, kwargs, output):
        positions = getattr(module, "positions", None)
        if positions is None:
            return output
        table = type(module).forward(module, int(positions.max()) + 1, packed_seq=True)  # [L, 1, 1, dim]
        return table[positions.reshape(-1)]

    chunk.register_forward_pre_hook(take_positions, with_kwargs=True)
    rotary.register_forward_hook(per_token, with_kwargs=True)
