"""megatron-core's parallel state on top of the worker group's existing torch.distributed group (sizes and their
rules: config.py)."""

from __future__ import annotations

import math

import torch

from rl.backends.megatron.config import BLOCK, MegatronConfig, layout_problems
from rl.backends.megatron.model import Layout


def init_parallel_state(options: MegatronConfig, world: int, seed: int = 1234, timeout_s: float | None = None) -> None:
    """Creates megatron's TP/PP/EP/DP groups once per process (policy and reference share them); `timeout_s`
    (trainer.collective_timeout_s) bounds their collectives, else megatron-core's default (30 minutes)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    tp, pp, ep = (options.tensor_model_parallel_size, options.pipeline_model_parallel_size,
                  options.expert_model_parallel_size)
    vp = options.virtual_pipeline_size()
    problems = layout_problems(world, tp, pp, ep, options.sequence_parallel, vp)
    if problems:
        raise ValueError("; ".join(f"{key}: {problem}" for key, problem in problems))
    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                ps.get_expert_model_parallel_world_size(), ps.get_virtual_pipeline_model_parallel_world_size() or 1)
        if have != (tp, pp, ep, vp):
            raise ValueError(f"{BLOCK}: parallel state already set up with (TP, PP, EP, VP) = {have}, asked "
                             f"{(tp, pp, ep, vp)}")
        return
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
                                 expert_model_parallel_size=ep, expert_tensor_parallel_size=tp,
                                 **({"distributed_timeout_minutes": math.ceil(timeout_s / 60)} if timeout_s else {}))
    with torch.random.fork_rng(devices=[]):  # the tracker seeds its own streams; keep the worker's generator
        model_parallel_cuda_manual_seed(seed)


def current_layout() -> Layout:
    from megatron.core import parallel_state as ps

    return Layout(tp=ps.get_tensor_model_parallel_world_size(), pp=ps.get_pipeline_model_parallel_world_size(),
                  ep=ps.get_expert_model_parallel_world_size(), tp_rank=ps.get_tensor_model_parallel_rank(),
                  pp_rank=ps.get_pipeline_model_parallel_rank(), ep_rank=ps.get_expert_model_parallel_rank(),
                  vp=ps.get_virtual_pipeline_model_parallel_world_size() or 1)
