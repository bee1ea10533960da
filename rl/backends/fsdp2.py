"""Strategy `fsdp2`: PyTorch's per-parameter sharding (`fully_shard`) over a 1-D mesh, or a 2-D HSDP mesh when
`fsdp_config.fsdp_size` is smaller than the world size (replicate across groups, shard within a group)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rl.backends.base import TrainingBackend
from rl.backends.dcp_checkpoint import DCPCheckpointMixin
from rl.backends.fsdp_config import FSDPConfig, offloads
from rl.backends.lora import add_lora
from rl.backends.mesh import device_mesh, sharded_blocks
from rl.backends.precision import bf16_compute
from rl.backends.weight_sync import Bucket, bucketed, rank0_buckets


class FSDP2Backend(DCPCheckpointMixin, TrainingBackend):
    defer_tied_head_grad = True  # the root's gathered (tied) weight lives from the lookup to the root's backward

    def build(self) -> None:
        spec, options = self.spec, FSDPConfig.from_options(self.spec.backend_options)
        model = self.load_model(sequence_parallel=spec.sequence_parallel_size > 1)
        self.use_sequence_parallel(model)
        if spec.lora:
            add_lora(model, spec.lora, spec.path, critic=self.is_critic)
        if spec.gradient_checkpointing and self.trainable:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        shard_kwargs = {
            "mesh": device_mesh(self.dist.device, self.dist.world_size, options.fsdp_size),
            "reshard_after_forward": options.reshard_after_forward,
        }
        if bf16_compute(spec.bf16, self.dist.device):
            shard_kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if offloads(options, self.dist.device.type, self.dist.is_main):
            shard_kwargs["offload_policy"] = CPUOffloadPolicy()
        for layer in sharded_blocks(model):
            fully_shard(layer, **shard_kwargs)
        fully_shard(model, **shard_kwargs)
        self.model = model
        if self.trainable:
            self.make_optimizer([p for p in model.parameters() if p.requires_grad])
        else:
            model.requires_grad_(False)

    def own_state_dict(self) -> dict[str, Tensor]:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def full_state_dict(self) -> dict[str, Tensor]:
        return self.own_to_hf(self.own_state_dict())

    def weight_buckets(self, bucket_bytes: int) -> Iterator[Bucket]:
        """One parameter gathered at a time (`DTensor.full_tensor`, collective), kept on rank 0 until its bucket
        is full: no rank holds more than a bucket of full tensors."""
        yield from rank0_buckets(self.hf_items(self._gathered(self.dist.is_main, "cpu")), bucket_bytes,
                                 self.dist.is_main)

    def device_buckets(self, bucket_bytes: int) -> Iterator[Bucket]:
        """`weight_buckets` on every rank, each tensor where the all-gather leaves it (this rank's device)."""
        yield from bucketed(self.hf_items(self._gathered(True, None)), bucket_bytes)

    def _gathered(self, keep: bool, device: str | None) -> Iterator[tuple[str, Tensor]]:
        """Each parameter in full (collective), yielded where `keep`: copied to `device`, or as gathered (None)."""
        for name, value in self.model.state_dict().items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            if keep:
                yield name, full.detach() if device is None else full.detach().to(device, copy=True)
            del full
