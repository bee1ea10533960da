"""Per-token logprobs and entropy from vocab-parallel logits, without gathering the vocabulary.

Each TP rank holds logits for its slice of the (padded) vocabulary. The softmax normalizer is assembled from
per-rank partial sums: a MAX all-reduce for the stabilizing maximum (no gradient), then SUM all-reduces of
exp-sums, the target logit and sum(p * logit) through megatron's `reduce_from_tensor_model_parallel_region`
(all-reduce forward, identity backward), so gradients flow to each rank's own slice only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def vocab_parallel_logprobs(logits: Tensor, targets: Tensor, vocab_start: int, vocab_size: int,
                            temperature: float, with_entropy: bool) -> tuple[Tensor, Tensor | None]:
    """logits [T, V_local] (this rank's columns from `vocab_start`), targets [T] global ids -> ([T], [T] or None).

    Columns at or past `vocab_size` (padding added to make the vocabulary divisible by TP) are excluded."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region as tp_sum

    local = logits.shape[-1]
    scaled = logits.float() / temperature
    padding = torch.arange(vocab_start, vocab_start + local, device=logits.device) >= vocab_size
    if bool(padding.any()):
        scaled = scaled.masked_fill(padding, float("-inf"))
    peak = scaled.detach().max(dim=-1).values
    if ps.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    shifted = scaled - peak[:, None]
    exp = shifted.exp()
    sum_exp = tp_sum(exp.sum(dim=-1))
    log_z = sum_exp.log()
    index = targets.long() - vocab_start
    mine = (index >= 0) & (index < local)
    picked = shifted.gather(-1, index.clamp(0, local - 1)[:, None]).squeeze(-1)
    target_logit = tp_sum(torch.where(mine, picked, torch.zeros_like(picked)))
    logprobs = target_logit - log_z
    if not with_entropy:
        return logprobs, None
    # E_p[logit] = sum(exp * logit) / Z: divide after the reduction, so every use of a reduced value is the same on
    # all TP ranks (the identity backward of tp_sum is only right for such uses).
    weighted = tp_sum((exp * shifted.masked_fill(padding, 0.0)).sum(dim=-1))
    return logprobs, log_z - weighted / sum_exp
