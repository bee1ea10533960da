"""Strategy `fsdp`: PyTorch's FullyShardedDataParallel (FSDP1), one unit per decoder layer.

`reshard_after_forward` picks FULL_SHARD (true) or SHARD_GRAD_OP (false); an `fsdp_size` below the world size gives
HYBRID_SHARD over a 2-D mesh. CPU offload is for the reference model only: FSDP1 cannot accumulate gradients
outside `no_sync` with offloaded parameters, and the config check rejects it for the policy.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy

from rl.backends.base import TrainingBackend
from rl.backends.dcp_checkpoint import DCPCheckpointMixin
from rl.backends.fsdp_config import FSDPConfig, offloads
from rl.backends.lora import add_lora
from rl.backends.mesh import device_mesh, sharded_blocks
from rl.backends.precision import bf16_compute
from rl.backends.weight_sync import Bucket, bucketed, rank0_buckets


def sharding_strategy(reshard_after_forward: bool, hybrid: bool) -> ShardingStrategy:
    if hybrid:
        return ShardingStrategy.HYBRID_SHARD if reshard_after_forward else ShardingStrategy._HYBRID_SHARD_ZERO2
    return ShardingStrategy.FULL_SHARD if reshard_after_forward else ShardingStrategy.SHARD_GRAD_OP


class FSDPBackend(DCPCheckpointMixin, TrainingBackend):
    def build(self) -> None:
        spec, device = self.spec, self.dist.device
        options = FSDPConfig.from_options(spec.backend_options)  # policy CPU offload is refused at config load
        model = self.load_model(sequence_parallel=spec.sequence_parallel_size > 1)
        self.use_sequence_parallel(model)
        if spec.lora:
            add_lora(model, spec.lora, spec.path, critic=self.is_critic)
        if spec.gradient_checkpointing and self.trainable:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layer_types = {type(layer) for layer in sharded_blocks(model)}
        hybrid = options.fsdp_size not in (-1, self.dist.world_size)
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_types)
        if spec.lora:
            # Each adapter its own unit: FSDP1's state dicts need a flat parameter to be all frozen or all trained.
            policy = functools.partial(_or_policy, policies=[policy, functools.partial(
                lambda_auto_wrap_policy, lambda_fn=_trainable_leaf)])
        self.model = FSDP(
            model,
            auto_wrap_policy=policy,
            sharding_strategy=sharding_strategy(options.reshard_after_forward, hybrid),
            device_mesh=device_mesh(device, self.dist.world_size, options.fsdp_size) if hybrid else None,
            cpu_offload=(CPUOffload(offload_params=True) if offloads(options, device.type, self.dist.is_main)
                         else None),
            # Every unit casts its inputs: a LoRA model's frozen weights stay outside FSDP on one-rank shard groups
            # (fp32 activations) while its adapter units compute in bf16.
            mixed_precision=(MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                            cast_forward_inputs=True)
                             if bf16_compute(spec.bf16, device) else None),
            device_id=device,
            use_orig_params=True,
            ignored_states=self._ignored(model, options.fsdp_size if hybrid else self.dist.world_size),
        )
        if self.trainable:
            self.make_optimizer([p for p in self.model.parameters() if p.requires_grad])
        else:
            self.model.requires_grad_(False)

    def _ignored(self, model: torch.nn.Module, shard_size: int) -> list[torch.nn.Parameter] | None:
        """A LoRA model's frozen weights stay outside FSDP when a shard group is one rank (one worker, or hybrid
        sharding with `fsdp_size=1`). There FSDP1 falls back to NO_SHARD, which keeps every weight whole anyway, and
        its NO_SHARD views of frozen flat parameters are left as plain tensors after a forward (gone from the state
        dict; a tied one fails its own assertion). The frozen weights are the same on every rank: nothing to sync."""
        if not self.spec.lora or shard_size > 1:
            return None
        return [p for p in model.parameters() if not p.requires_grad]

    def clip_grad_norm(self) -> float:
        return float(self.model.clip_grad_norm_(self.spec.max_grad_norm))

    def weight_buckets(self, bucket_bytes: int) -> Iterator[Bucket]:
        """One FSDP unit (a decoder layer, then the root's own parameters) gathered at a time
        (`summon_full_params(recurse=False)`, collective), its parameters copied on rank 0 until a bucket is full.
        Tied weights come once, under their first name."""
        yield from rank0_buckets(self.hf_items(self._unit_tensors(self.dist.is_main, "cpu")), bucket_bytes,
                                 self.dist.is_main)

    def device_buckets(self, bucket_bytes: int) -> Iterator[Bucket]:
        """`weight_buckets` on every rank, each tensor copied where the unit's gather puts it (this rank's device)."""
        yield from bucketed(self.hf_items(self._unit_tensors(True, None)), bucket_bytes)

    def _unit_tensors(self, keep: bool, device: str | None) -> Iterator[tuple[str, Tensor]]:
        """Each unit's parameters in full (collective), copied out of the gather where `keep` (to `device`; None:
        where the gather put them)."""
        wrapper = "_fsdp_wrapped_module."
        clean = lambda name: name.replace(wrapper, "")  # noqa: E731
        units = {clean(name): unit for name, unit in self.model.named_modules() if isinstance(unit, FSDP)}
        seen: set[int] = set()
        for prefix, unit in units.items():
            nested = [other + "." for other in units if other != prefix and other.startswith(prefix)]
            with FSDP.summon_full_params(unit, recurse=False, writeback=False):
                for name, param in unit.named_parameters():
                    full = (prefix + "." if prefix else "") + clean(name)
                    if any(full.startswith(inner) for inner in nested) or id(param) in seen:
                        continue  # a nested unit's (still sharded) parameter, or a tied alias
                    seen.add(id(param))
                    if keep:
                        yield full, param.detach().to(device or param.device, copy=True)

    def full_state_dict(self) -> dict[str, Tensor]:
        return self.own_to_hf(self.own_state_dict())

    def own_state_dict(self) -> dict[str, Tensor]:
        # Offloading the gathered state to CPU segfaults FSDP1 on CPU-only hosts; there it is on the CPU already.
        offload = self.dist.device.type == "cuda"
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
        if offload:
            return state
        return {name: tensor.detach().clone() for name, tensor in state.items()} if self.dist.is_main else {}


def _trainable_leaf(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return not list(module.children()) and isinstance(weight, torch.nn.Parameter) and weight.requires_grad
