"""PackedBatch -> megatron THD inputs.

Every rank of a model-parallel group (TP x PP) receives the same micro-batches from the driver (one data-parallel
shard), so nothing is exchanged here: each micro-batch becomes one THD sequence of `[1, T]` tokens.
"""

from __future__ import annotations

import torch

from rl.core.packing import PackedBatch


def pad_multiple(tp: int, sequence_parallel: bool) -> int:
    """Tokens per forward must divide evenly over TP ranks when the sequence is sharded (SP)."""
    return tp if sequence_parallel and tp > 1 else 1


def padded_lengths(batches: list[PackedBatch], multiple: int, same: bool) -> list[int]:
    """Token count each micro-batch is padded to: a multiple of `multiple`, and with `same` one length for all of
    them, since pipeline stages exchange activations of the shape the schedule was given."""
    lengths = [-(-max(b.num_tokens, 1) // multiple) * multiple for b in batches]
    return [max(lengths)] * len(lengths) if same else lengths


def thd_inputs(batch: PackedBatch, length: int, device: torch.device):
    """(input_ids [1, length], position_ids [1, length], PackedSeqParams); the tokens past the batch's own form one
    segment of their own at the end, so no real token attends to them."""
    from megatron.core.packed_seq_params import PackedSeqParams

    extra = length - batch.num_tokens
    if extra < 0:
        raise ValueError(f"a micro-batch of {batch.num_tokens} tokens cannot be padded to {length}")
    ids, pos, cu = batch.input_ids, batch.position_ids, batch.cu_seqlens.to(torch.int32)
    if extra:
        ids = torch.cat([ids, ids.new_zeros(extra)])
        pos = torch.cat([pos, torch.arange(extra, dtype=pos.dtype)])
        cu = torch.cat([cu, cu.new_tensor([length])])
    cu = cu.to(device)
    longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                             max_seqlen_kv=longest)
    return ids[None].to(device), pos[None].to(device), params
