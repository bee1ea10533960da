"""Helpers shared by the Hugging Face sharding strategies: the device mesh and the decoder blocks to wrap."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def device_mesh(device: torch.device, world_size: int, fsdp_size: int) -> DeviceMesh:
    """1-D shard mesh over the world, or a 2-D (replicate, shard) HSDP mesh when `fsdp_size` is smaller."""
    if fsdp_size in (-1, world_size):
        return init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(device.type, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard"))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (Qwen2/Llama/Mistral-style `model.layers`; a
    vision-language model's `model.language_model.layers`)."""
    body = getattr(model, "model", None)
    layers = getattr(getattr(body, "language_model", body), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no `model.layers`: cannot find its decoder blocks to shard")
    return list(layers)


def sharded_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks a sharding strategy wraps one by one: the decoder's, and a vision tower's (`model.visual`)."""
    from rl.backends.multimodal import vision_tower

    return decoder_layers(model) + list(getattr(vision_tower(model, required=False), "blocks", []))
