"""megatron-core's parallel state on top of the worker group's existing torch.distributed group.

Sizes: TP x PP ranks share one copy of the dense weights, so the dense data-parallel size is
world / (TP * PP). Experts are split over EP ranks with expert tensor parallelism ETP = TP, so the expert
data-parallel size is world / (TP * EP * PP). Both must be whole numbers (megatron-core's rule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.backends.megatron.model import Layout

_KEY = "trainer.policy.megatron_config."


@dataclass(frozen=True)
class MegatronOptions:
    """The `megatron_config` block as the backend uses it (see rl/core/config/schema_backends.py)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    sequence_parallel: bool = False
    recompute_granularity: str | None = None
    transformer_config_kwargs: dict | None = None
    optimizer_cpu_offload: bool = False

    @classmethod
    def from_dict(cls, options: dict | None) -> MegatronOptions:
        known = {k: v for k, v in (options or {}).items() if k in cls.__dataclass_fields__}
        unknown = sorted(set(options or {}) - set(known))
        if unknown:
            raise ValueError(f"{_KEY}: unknown keys {unknown}")
        return cls(**known)


def check_sizes(world: int, tp: int, pp: int, ep: int, sequence_parallel: bool) -> None:
    if world % (tp * pp):
        raise ValueError(f"{_KEY}tensor_model_parallel_size ({tp}) * pipeline_model_parallel_size ({pp}) must divide "
                         f"the world size {world}: the dense data-parallel size is world / (TP * PP)")
    if world % (tp * ep * pp):
        raise ValueError(f"{_KEY}expert_model_parallel_size: TP {tp} * EP {ep} * PP {pp} must divide the world size "
                         f"{world}: the expert data-parallel size is world / (TP * EP * PP)")
    if sequence_parallel and tp == 1:
        raise ValueError(f"{_KEY}sequence_parallel needs tensor_model_parallel_size > 1")


def init_parallel_state(options: MegatronOptions, world: int, seed: int = 1234) -> None:
    """Creates megatron's TP/PP/EP/DP groups once per process (policy and reference share them)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    tp, pp, ep = (options.tensor_model_parallel_size, options.pipeline_model_parallel_size,
                  options.expert_model_parallel_size)
    check_sizes(world, tp, pp, ep, options.sequence_parallel)
    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                ps.get_expert_model_parallel_world_size())
        if have != (tp, pp, ep):
            raise ValueError(f"{_KEY}: parallel state already set up with (TP, PP, EP) = {have}, asked {(tp, pp, ep)}")
        return
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep, expert_tensor_parallel_size=tp)
    with torch.random.fork_rng(devices=[]):  # the tracker seeds its own streams; keep the worker's generator
        model_parallel_cuda_manual_seed(seed)


def current_layout() -> Layout:
    from megatron.core import parallel_state as ps

    return Layout(tp=ps.get_tensor_model_parallel_world_size(), pp=ps.get_pipeline_model_parallel_world_size(),
                  ep=ps.get_expert_model_parallel_world_size(), tp_rank=ps.get_tensor_model_parallel_rank(),
                  pp_rank=ps.get_pipeline_model_parallel_rank(), ep_rank=ps.get_expert_model_parallel_rank())
