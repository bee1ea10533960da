"""Megatron checkpoints in Megatron-LM's per-rank layout, and gathering shards into one HF state dict.

A checkpoint directory holds `mp_rank_{tp:02d}_{pp:03d}_{ep:03d}/model_optim_rng.pt` per distinct model shard (the
first rank holding that shard writes it; data-parallel replicas read it), each with `model` (the local megatron
state dict), and, when saved from training, `scheduler` and (after the first step) `optimizer`: megatron's own format
for its distributed optimizer (`distributed_optimizer_state`), gathered over DP, so every shard file holds the whole
optimizer state of its model shard and loads at any DP size; with `optimizer_cpu_offload`, HostAdamW's state dict.
With the interleaved schedule (VP model chunks per pipeline rank) each chunk is stored as the pipeline stage it is
in a plain PP * VP pipeline (`Layout.chunk`); the rank's optimizer and schedule go with its first chunk, marked
with the (PP, VP) they were saved under.
`rl.launch.convert` writes the same layout from a Hugging Face checkpoint for any TP/PP/EP without starting a process
group.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor

from rl.backends.megatron.model import Layout

FILE = "model_optim_rng.pt"


def shard_dir(root: str, tp_rank: int, pp_rank: int, ep_rank: int) -> str:
    return os.path.join(root, f"mp_rank_{tp_rank:02d}_{pp_rank:03d}_{ep_rank:03d}")


def model_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """Weights only (megatron's `_extra_state` entries are empty for the local spec)."""
    return {k: v.detach().cpu() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


def distributed_optimizer_state(optimizer) -> list[dict]:
    """Per DistributedOptimizer of the chain (dense, then experts): its `state_dict()` (param groups, step) and, as
    "param_state", its parameter state (fp32 main params, exp_avg, exp_avg_sq) gathered over its DP group into
    unpadded tensors (`get_parameter_state_dp_zero`). Collective; every rank gets the result, so whichever rank writes
    a shard file has it. Needs one optimizer step taken (megatron reads the step from the AdamW state)."""
    states = []
    for opt in optimizer.chained_optimizers:
        state = opt.state_dict()
        state["param_state"] = opt.get_parameter_state_dp_zero(return_on_all_ranks=True)
        states.append(state)
    return states


@torch.no_grad()  # the fp32 main params it writes are views of the weights, which require grad
def load_distributed_optimizer_state(optimizer, states: list[dict]) -> None:
    """Undoes `distributed_optimizer_state` (collective: DP rank 0 of each optimizer scatters the shards).
    With torch's AdamW inside, megatron-core 0.16.1's `load_state_dict` gives every parameter one shared "step"
    tensor (AdamW would advance it once per parameter), and `load_parameter_state_from_dp_zero` copies every state
    key, "step" included, which the gathered state lacks (KeyError): "step" is set aside while the shards load, then
    each parameter gets its own copy."""
    for opt, saved in zip(optimizer.chained_optimizers, states, strict=True):
        saved = dict(saved)
        param_state = saved.pop("param_state")
        opt.load_state_dict(saved)  # param groups and step; allocates the state tensors
        inner = opt.optimizer.state
        steps = {param: state.pop("step") for param, state in inner.items() if "step" in state}
        opt.load_parameter_state_from_dp_zero(param_state)
        for param, step in steps.items():
            inner[param]["step"] = step.clone()


def chunk_states(chunks: list[torch.nn.Module]) -> list[dict[str, Tensor]]:
    return [model_state(chunk) for chunk in chunks]


def write_shard(root: str, layout: Layout, state: dict) -> None:
    """Writes one shard file atomically (beside it, then renamed)."""
    directory = shard_dir(root, layout.tp_rank, layout.pp_rank, layout.ep_rank)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, FILE)
    torch.save(state, path + ".partial")
    os.replace(path + ".partial", path)


def read_shard(root: str, layout: Layout) -> dict:
    path = os.path.join(shard_dir(root, layout.tp_rank, layout.pp_rank, layout.ep_rank), FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: the checkpoint at {root} was not written for TP={layout.tp}, "
                                f"PP={layout.pp}, EP={layout.ep} (convert it with rl.launch.convert)")
    return torch.load(path, map_location="cpu", weights_only=False)


def read_chunks(root: str, layout: Layout) -> list[dict]:
    """The shard files of this rank's model chunks (one without the interleaved schedule)."""
    return [read_shard(root, chunk) for chunk in layout.chunks()]


def save_distributed(root: str, layout: Layout, states: list[dict]) -> None:
    """Collective: the first rank holding each (tp, pp, ep) shard writes the files of its model chunks, `states[k]`
    as chunk k's."""
    coords = (layout.tp_rank, layout.pp_rank, layout.ep_rank)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, coords)
    if everyone.index(coords) == dist.get_rank():
        for chunk, state in zip(layout.chunks(), states, strict=True):
            write_shard(root, chunk, state)
    dist.barrier()


def gather_shards(states: list[dict[str, Tensor]], layout: Layout
                  ) -> dict[tuple[int, int, int], dict[str, Tensor]] | None:
    """Every rank's local weights (`states[k]`: model chunk k's), keyed by (tp_rank, pp_rank, ep_rank) of the plain
    PP * VP pipeline the chunks form (`Layout.chunk`), on rank 0 (None elsewhere). Collective."""
    mine = [((c.tp_rank, c.pp_rank, c.ep_rank), state) for c, state in zip(layout.chunks(), states, strict=True)]
    gathered: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    return {coords: state for rank in gathered for coords, state in rank} if gathered is not None else None
