"""Megatron checkpoints in Megatron-LM's per-rank layout, and gathering shards into one HF state dict.

A checkpoint directory holds `mp_rank_{tp:02d}_{pp:03d}_{ep:03d}/model_optim_rng.pt` per distinct model shard (the
first rank holding that shard writes it; data-parallel replicas read it), each with `model` (the local megatron
state dict), and, when saved from training, `optimizer` and `scheduler`. `rl.launch.convert` writes the same
layout from a Hugging Face checkpoint for any TP/PP/EP without starting a process group.
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


def save_distributed(root: str, layout: Layout, state: dict) -> None:
    """Collective: the first rank holding each (tp, pp, ep) shard writes it."""
    coords = (layout.tp_rank, layout.pp_rank, layout.ep_rank)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, coords)
    if everyone.index(coords) == dist.get_rank():
        write_shard(root, layout, state)
    dist.barrier()


def gather_shards(model: torch.nn.Module, layout: Layout) -> dict[tuple[int, int, int], dict[str, Tensor]] | None:
    """Every rank's local weights, keyed by (tp_rank, pp_rank, ep_rank), on rank 0 (None elsewhere). Collective."""
    mine = ((layout.tp_rank, layout.pp_rank, layout.ep_rank), model_state(model))
    gathered: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    return dict(gathered) if gathered is not None else None
