"""Gradient reduction, global norm and clipping for megatron-core models stepped by a torch optimizer.

What megatron's DDP + finalize_model_grads do, for plain `.grad` tensors:
- sequence-parallel parameters (norms, router with SP: `param.sequence_parallel`) hold partial grads per TP rank:
  SUM over the TP group;
- tied embeddings split over the first and last pipeline stage: SUM over the embedding group;
- dense parameters: SUM over the data-parallel group; expert parameters (`param.allreduce == False`): SUM over the
  expert data-parallel group (the loss is already scaled so that the sum is the mini-batch gradient).
The norm counts each distinct parameter element once: TP-replicated tensors on TP rank 0 only, the tied output copy
on the first stage only, DP replicas on DP rank 0 only; then one SUM over the world.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _is_expert(param: nn.Parameter) -> bool:
    return not getattr(param, "allreduce", True)


def _all_reduce(tensors: list[torch.Tensor], group) -> None:
    if not tensors or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def reduce_gradients(model: nn.Module) -> None:
    from megatron.core import parallel_state as ps

    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    _all_reduce([p.grad for p in params if getattr(p, "sequence_parallel", False)],
                ps.get_tensor_model_parallel_group())
    if ps.get_pipeline_model_parallel_world_size() > 1 and ps.is_rank_in_embedding_group(ignore_virtual=True):
        _all_reduce([p.grad for p in params if getattr(p, "shared_embedding", False)], ps.get_embedding_group())
    _all_reduce([p.grad for p in params if not _is_expert(p)], ps.get_data_parallel_group())
    _all_reduce([p.grad for p in params if _is_expert(p)], ps.get_expert_data_parallel_group())


def _counts_toward_norm(param: nn.Parameter) -> bool:
    from megatron.core import parallel_state as ps

    if _is_expert(param):
        owner = ps.get_expert_tensor_parallel_rank() == 0 and ps.get_expert_data_parallel_rank() == 0
    else:
        owner = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
    sharded = getattr(param, "tensor_model_parallel", False)
    if sharded:
        owner = ps.get_expert_data_parallel_rank() == 0 if _is_expert(param) else ps.get_data_parallel_rank() == 0
    if getattr(param, "shared_embedding", False) and not ps.is_pipeline_first_stage(ignore_virtual=True):
        return False
    return owner


def clip_gradients(model: nn.Module, max_norm: float) -> float:
    """Global L2 norm of the reduced gradients; scales them by max_norm / norm when larger (as torch does)."""
    params = [p for p in model.parameters() if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float64, device=params[0].device if params else "cpu")
    for p in params:
        if _counts_toward_norm(p):
            squares += p.grad.detach().double().pow(2).sum()
    dist.all_reduce(squares)
    norm = float(squares.sqrt())
    coef = max_norm / (norm + 1e-6)
    if max_norm > 0 and coef < 1.0:
        for p in params:
            p.grad.mul_(coef)
    return norm
