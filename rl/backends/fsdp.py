"""Strategy `fsdp`: PyTorch's FullyShardedDataParallel (FSDP1), one unit per decoder layer.

`reshard_after_forward` picks FULL_SHARD (true) or SHARD_GRAD_OP (false); an `fsdp_size` below the world size gives
HYBRID_SHARD over a 2-D mesh. CPU offload is for the reference model only: FSDP1 cannot accumulate gradients
outside `no_sync` with offloaded parameters, and the config check rejects it for the policy.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from rl.backends.base import TrainingBackend
from rl.backends.dcp_checkpoint import DCPCheckpointMixin
from rl.backends.fsdp_config import FSDPConfig, offloads
from rl.backends.hf_model import load_causal_lm
from rl.backends.mesh import decoder_layers, device_mesh


def sharding_strategy(reshard_after_forward: bool, hybrid: bool) -> ShardingStrategy:
    if hybrid:
        return ShardingStrategy.HYBRID_SHARD if reshard_after_forward else ShardingStrategy._HYBRID_SHARD_ZERO2
    return ShardingStrategy.FULL_SHARD if reshard_after_forward else ShardingStrategy.SHARD_GRAD_OP


class FSDPBackend(DCPCheckpointMixin, TrainingBackend):
    def build(self) -> None:
        spec, device = self.spec, self.dist.device
        options = FSDPConfig.from_options(spec.backend_options)  # policy CPU offload is refused at config load
        model = load_causal_lm(spec.path, device)
        if spec.gradient_checkpointing and self.trainable:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layer_types = {type(layer) for layer in decoder_layers(model)}
        hybrid = options.fsdp_size not in (-1, self.dist.world_size)
        self.model = FSDP(
            model,
            auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_types),
            sharding_strategy=sharding_strategy(options.reshard_after_forward, hybrid),
            device_mesh=device_mesh(device, self.dist.world_size, options.fsdp_size) if hybrid else None,
            cpu_offload=(CPUOffload(offload_params=True) if offloads(options, device.type, self.dist.is_main)
                         else None),
            mixed_precision=(MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                             if device.type == "cuda" else None),
            device_id=device,
            use_orig_params=True,
        )
        if self.trainable:
            self.make_optimizer(self.model.parameters())
        else:
            self.model.requires_grad_(False)

    def clip_grad_norm(self) -> float:
        return float(self.model.clip_grad_norm_(self.spec.max_grad_norm))

    def full_state_dict(self) -> dict[str, Tensor]:
        # Offloading the gathered state to CPU segfaults FSDP1 on CPU-only hosts; there it is on the CPU already.
        offload = self.dist.device.type == "cuda"
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
        if offload:
            return state
        return {name: tensor.detach().clone() for name, tensor in state.items()} if self.dist.is_main else {}
