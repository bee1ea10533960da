"""PackedBatch -> megatron THD inputs, and the exchange of micro-batches inside a model-parallel group.

The trainer gives every worker its own micro-batches (it treats each worker as a data-parallel rank). Ranks of one
TP x PP group must run the same tokens, so each call first all-gathers the group's batches and runs them as one
packed batch; every rank then keeps the results for its own sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from rl.core.packing import PackedBatch
from rl.core.packing.batch import TOKEN_FIELDS


def concat_batches(batches: list[PackedBatch]) -> PackedBatch:
    """One packed batch holding every slot of `batches` in order (padding inside slots kept)."""
    offsets = [0]
    for b in batches:
        offsets.append(offsets[-1] + b.num_tokens)
    cu = torch.cat([batches[0].cu_seqlens[:1]] + [b.cu_seqlens[1:] + off for b, off in zip(batches, offsets,
                                                                                             strict=False)])
    fields = {name: None if any(getattr(b, name) is None for b in batches) else
              torch.cat([getattr(b, name) for b in batches]) for name in TOKEN_FIELDS}
    return PackedBatch(
        input_ids=torch.cat([b.input_ids for b in batches]), cu_seqlens=cu.to(torch.int32),
        seq_lengths=torch.cat([b.seq_lengths for b in batches]),
        position_ids=torch.cat([b.position_ids for b in batches]),
        loss_mask=torch.cat([b.loss_mask for b in batches]), seq_index=torch.cat([b.seq_index for b in batches]),
        padded=False, **fields,
    )


@dataclass(frozen=True)
class GroupBatch:
    """The model-parallel group's tokens as one batch, and where this rank's tokens lie in it."""

    batch: PackedBatch
    start: int
    stop: int
    group_size: int


def gather_group_batch(batch: PackedBatch) -> GroupBatch:
    from megatron.core import parallel_state as ps

    group = ps.get_model_parallel_group()
    size = dist.get_world_size(group)
    if size == 1:
        return GroupBatch(batch, 0, batch.num_tokens, 1)
    batches: list = [None] * size
    dist.all_gather_object(batches, batch.to("cpu"), group=group)
    me = dist.get_rank(group)
    start = sum(b.num_tokens for b in batches[:me])
    return GroupBatch(concat_batches(batches), start, start + batch.num_tokens, size)


def pad_multiple(tp: int, sequence_parallel: bool) -> int:
    """Tokens per forward must divide evenly over TP ranks when the sequence is sharded (SP)."""
    return tp if sequence_parallel and tp > 1 else 1


def thd_inputs(batch: PackedBatch, multiple: int, device: torch.device):
    """(input_ids [1, T'], position_ids [1, T'], PackedSeqParams) with T' a multiple of `multiple`; the extra tokens
    form one segment of their own at the end, so no real token attends to them."""
    from megatron.core.packed_seq_params import PackedSeqParams

    extra = -batch.num_tokens % multiple
    ids, pos, cu = batch.input_ids, batch.position_ids, batch.cu_seqlens.to(torch.int32)
    if extra:
        ids = torch.cat([ids, ids.new_zeros(extra)])
        pos = torch.cat([pos, torch.arange(extra, dtype=pos.dtype)])
        cu = torch.cat([cu, cu.new_tensor([batch.num_tokens + extra])])
    cu = cu.to(device)
    longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                             max_seqlen_kv=longest)
    return ids[None].to(device), pos[None].to(device), params


def broadcast_from_last_stage(tensor: Tensor | None, shape: tuple[int, ...], device: torch.device) -> Tensor:
    """The last pipeline stage's tensor on every stage of this rank's pipeline."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return tensor
    if tensor is None:
        tensor = torch.empty(shape, dtype=torch.float32, device=device)
    tensor = tensor.detach().float().contiguous()
    dist.broadcast(tensor, src=ps.get_pipeline_model_parallel_last_rank(),
                   group=ps.get_pipeline_model_parallel_group())
    return tensor
