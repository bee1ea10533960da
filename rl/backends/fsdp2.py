"""Strategy `fsdp2`: PyTorch's per-parameter sharding (`fully_shard`) over a 1-D mesh, or a 2-D HSDP mesh when
`fsdp_config.fsdp_size` is smaller than the world size (replicate across groups, shard within a group)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from rl.backends.base import BACKENDS, TrainingBackend
from rl.backends.dcp_checkpoint import DCPCheckpointMixin
from rl.backends.hf_model import load_causal_lm


def device_mesh(device: torch.device, world_size: int, fsdp_size: int) -> DeviceMesh:
    if fsdp_size in (-1, world_size):
        return init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(device.type, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard"))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (Qwen2/Llama/Mistral-style `model.layers`)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no `model.layers`: fsdp2 cannot find its decoder blocks")
    return list(layers)


@BACKENDS.register("fsdp2")
class FSDP2Backend(DCPCheckpointMixin, TrainingBackend):
    def build(self) -> None:
        spec = self.spec
        model = load_causal_lm(spec.path, self.dist.device)
        if spec.gradient_checkpointing and self.trainable:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        shard_kwargs = {
            "mesh": device_mesh(self.dist.device, self.dist.world_size, spec.fsdp_size),
            "reshard_after_forward": spec.reshard_after_forward,
        }
        if self.dist.device.type == "cuda":
            shard_kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if spec.cpu_offload:
            shard_kwargs["offload_policy"] = CPUOffloadPolicy()
        for layer in decoder_layers(model):
            fully_shard(layer, **shard_kwargs)
        fully_shard(model, **shard_kwargs)
        self.model = model
        if self.trainable:
            self.make_optimizer(model.parameters())
        else:
            model.requires_grad_(False)

    def full_state_dict(self) -> dict[str, Tensor]:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)
