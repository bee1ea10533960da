"""Strategy `deepspeed`: a DeepSpeed engine with ZeRO stage 1-3 around the Hugging Face model.

`deepspeed_config.train` (policy) and `deepspeed_config.eval` (reference) are merged over deepspeed_defaults.yaml
and passed to DeepSpeed as they are. The trainer keeps control of accumulation: every micro-batch is a backward,
and the optimizer step happens at the accumulation boundary the trainer marks.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator

from torch import Tensor

from rl.backends.base import TrainingBackend, weights_finite
from rl.backends.deepspeed_config import merged_section
from rl.backends.lora import add_lora, trains_with_adapters, with_base, write_adapter_config
from rl.backends.precision import bf16_compute
from rl.backends.weight_sync import Bucket, bucketed, rank0_buckets

CHECKPOINT_TAG = "state"


def engine_config(section: str, user: dict, max_grad_norm: float, bf16: bool) -> dict:
    config = merged_section(section, user)
    config.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1)
    if section == "train":
        config.setdefault("gradient_clipping", max_grad_norm)
    config.setdefault("bf16", {"enabled": bf16})  # a `bf16` block of deepspeed_config wins
    if bf16:  # DeepSpeed reduces and keeps gradients in the model's dtype unless told: float32, as every strategy
        config.setdefault("communication_data_type", "fp32")
        if config.get("zero_optimization", {}).get("stage", 0) > 0:  # without ZeRO only bf16 accumulates
            config.setdefault("data_types", {"grad_accum_dtype": "fp32"})
    return config


class DeepSpeedBackend(TrainingBackend):
    def build(self) -> None:
        import deepspeed

        spec, bf16 = self.spec, bf16_compute(self.spec.bf16, self.dist.device)
        model = self.load_model()
        if spec.lora:
            add_lora(model, spec.lora, spec.path, critic=self.is_critic)
        if spec.gradient_checkpointing and self.trainable:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        section = "train" if self.trainable else "eval"
        self.config = engine_config(section, spec.backend_options or {}, spec.max_grad_norm, bf16)
        if self.trainable:
            self.make_optimizer([p for p in model.parameters() if p.requires_grad])
        else:
            model.requires_grad_(False)
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=self.optimizer, lr_scheduler=self.scheduler,
                                               config=self.config, dist_init_required=False)
        self.model = self.engine.module
        if spec.lora:  # checkpoints keep what trains only: a tied LM head is listed apart from its frozen parameter
            module_state, critic = self.engine.module_state_dict, self.is_critic
            self.engine.module_state_dict = lambda *args, **kwargs: {
                name: value for name, value in module_state(*args, **kwargs).items()
                if trains_with_adapters(name, critic)}

    @property
    def zero_stage(self) -> int:
        return int(self.config.get("zero_optimization", {}).get("stage", 0))

    def forward_module(self):
        return self.engine

    def backward(self, loss: Tensor, last_micro_batch: bool) -> None:
        # ZeRO reduces the accumulated gradients during the backward that closes the window.
        self.engine.set_gradient_accumulation_boundary(last_micro_batch)
        self.engine.backward(loss)

    def optimizer_step(self) -> dict[str, float]:
        """ZeRO's optimizers skip a step whose reduced gradients are not finite (and report an inf norm); without
        ZeRO the reduced gradients are whole on every rank, so every rank drops a non-finite one here alike."""
        lr = self.engine.get_lr()[0]
        if self.zero_stage == 0 and not weights_finite(p.grad for p in self.model.parameters() if p.grad is not None):
            self.engine.zero_grad()
            return {"grad_norm": math.nan, "lr": lr, "skipped_steps": 1.0}
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        norm = float(norm) if norm is not None else 0.0
        return {"grad_norm": norm, "lr": lr, "skipped_steps": float(not math.isfinite(norm))}

    def weights_finite(self) -> bool:
        """This rank's own weights: under ZeRO-3 its partition of each parameter."""
        return weights_finite(getattr(p, "ds_tensor", p) for p in self.model.parameters())

    def save_checkpoint(self, path: str) -> None:
        # A LoRA policy's checkpoint holds its adapters (and their optimizer state); the base stays at model.path.
        lora = bool(self.spec.lora)
        self.engine.save_checkpoint(path, tag=CHECKPOINT_TAG, exclude_frozen_parameters=lora)
        if lora and self.dist.is_main:
            write_adapter_config(path, self.spec.lora, self.spec.path)

    def load_checkpoint(self, path: str) -> None:
        self.engine.load_checkpoint(path, tag=CHECKPOINT_TAG, load_optimizer_states=True,
                                    load_lr_scheduler_states=True, load_module_strict=not self.spec.lora)

    @classmethod
    def checkpoint_weights(cls, path: str, model_path: str) -> dict[str, Tensor]:
        """The fp32 master weights of every ZeRO stage, merged from all ranks' optimizer shards by DeepSpeed's
        own `zero_to_fp32`."""
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        if not os.path.isdir(os.path.join(path, CHECKPOINT_TAG)):
            raise FileNotFoundError(f"{path} has no {CHECKPOINT_TAG}/ folder: not a checkpoint of this DeepSpeed "
                                    "backend")
        return with_base(path, model_path, dict(get_fp32_state_dict_from_zero_checkpoint(path, tag=CHECKPOINT_TAG)))

    def full_state_dict(self) -> dict[str, Tensor]:
        return self.own_to_hf(self.own_state_dict())

    def own_state_dict(self) -> dict[str, Tensor]:
        import deepspeed

        gathered = (deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None)
                    if self.zero_stage == 3 else contextlib.nullcontext())
        with gathered:
            if not self.dist.is_main:
                return {}
            return {name: tensor.detach().to("cpu", copy=True) for name, tensor in self.model.state_dict().items()}

    def weight_buckets(self, bucket_bytes: int) -> Iterator[Bucket]:
        """Parameters gathered in groups of about `bucket_bytes` (full size): under ZeRO-3 each group on its own
        (`GatheredParameters`, collective), released before the next, so no rank holds the whole model. Tied
        weights come once, under their first name."""
        yield from rank0_buckets(self.hf_items(self._group_tensors(bucket_bytes, self.dist.is_main, "cpu")),
                                 bucket_bytes, self.dist.is_main)

    def device_buckets(self, bucket_bytes: int) -> Iterator[Bucket]:
        """`weight_buckets` on every rank, each tensor copied where the gather puts it (this rank's device)."""
        yield from bucketed(self.hf_items(self._group_tensors(bucket_bytes, True, None)), bucket_bytes)

    def _group_tensors(self, group_bytes: int, keep: bool, device: str | None) -> Iterator[tuple[str, Tensor]]:
        """Groups of parameters in full (collective under ZeRO-3), copied out where `keep` (to `device`; None:
        where the gather put them)."""
        import deepspeed

        def gathered(group):
            context = (deepspeed.zero.GatheredParameters([p for _, p in group], modifier_rank=None)
                       if self.zero_stage == 3 else contextlib.nullcontext())
            with context:
                return [(n, p.detach().to(device or p.device, copy=True)) for n, p in group] if keep else []

        group, size = [], 0
        for name, param in self.model.named_parameters():
            group.append((name, param))
            size += getattr(param, "ds_numel", param.numel()) * param.element_size()  # full size under ZeRO-3
            if size >= group_bytes:
                yield from gathered(group)
                group, size = [], 0
        if group:
            yield from gathered(group)

    def offload(self) -> None:
        if self.dist.device.type == "cuda" and self.zero_stage == 3:
            self.engine.offload_states()
        else:
            super().offload()

    def reload(self) -> None:
        if self.dist.device.type == "cuda" and self.zero_stage == 3:
            self.engine.reload_states()
        else:
            super().reload()
