"""The interface every training strategy implements (the registry that picks one by name is `registry.py`).

A backend owns one model (policy or reference) on one worker of an SPMD group. Everything a strategy does not
change — logprobs from a `PackedBatch`, the shared loss from `rl.core.algorithms`, gradient accumulation, clipping,
the optimizer and its schedule — lives here, so a strategy module only says how to wrap, checkpoint and export.
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rl.backends.dist import DistInfo
from rl.backends.hf_forward import batch_logprobs, batch_values
from rl.backends.hidden_loss import hidden_logprobs, hidden_policy_loss
from rl.backends.ulysses import SequenceParallel, gradient_scale
from rl.backends.weight_sync import Bucket, bucketed
from rl.core.algorithms import LossNormalizer, LossSettings, compute_policy_loss
from rl.core.algorithms.lr_schedule import lr_factor
from rl.core.algorithms.sft_loss import SupervisedLossSettings
from rl.core.algorithms.value_loss import ValueLossSettings, compute_value_loss
from rl.core.packing import PackedBatch


@dataclass(frozen=True)
class DataParallelRank:
    """A worker's place in the data-parallel layout: ranks with the same `index` (a model-parallel group) run the
    same micro-batches, and the one with `reports` set returns their results to the driver."""

    size: int
    index: int
    reports: bool


@dataclass(frozen=True)
class ModelSpec:
    """What a backend builds: which weights, for which role, with which of the run's settings."""

    path: str
    role: str  # "policy", "ref" or "critic" (a value head in place of the LM head: `rl.backends.value_head`)
    temperature: float
    gradient_checkpointing: bool = False
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    lr_warmup_steps: int = 0
    scheduler: str = "constant"  # after the warm-up (rl.core.algorithms.lr_schedule)
    min_lr: float = 0.0
    lr_decay_steps: int = 0  # the optimizer step at which a decay reaches min_lr
    backend_options: dict | None = None  # the strategy's own settings (StrategyConfig.backend_options)
    kernels: str = "auto"  # trainer.kernels: implementation of the token-logprob op (rl.kernels.ops)
    fused_kernels: bool = False  # trainer.policy.use_fused_kernels: loss and logprobs from hidden states, chunked
    fused_chunk_size: int | None = None  # trainer.policy.fused_kernel_chunk_size
    lora: dict | None = None  # trainer.policy.model.lora when rank > 0 (policy only): adapters on the base model
    freeze_vision_tower: bool = False  # trainer.policy.model.freeze_vision_tower: train the language model only
    sequence_parallel_size: int = 1  # trainer.policy.sequence_parallel_size: Ulysses over groups of this many ranks
    bf16: bool | None = None  # trainer.bf16: bf16 compute, fp32 master weights (`precision.bf16_compute`)
    flash_attn: bool | None = None  # trainer.flash_attn (`hf_model.attention_implementation`)
    exact: bool = False  # trainer.exact_on_policy (policy only): batch-invariant arithmetic (`rl.core.batch_invariant`)


class TrainingBackend(abc.ABC):
    """One model on one worker. Subclasses implement `wrap_model` and the checkpoint/export methods."""

    # On the fused path with tied embeddings, compute the LM head's weight gradient at the end of backward (one
    # more [tokens, V] matmul) so that it never coexists with the body's activations; worth it where the gathered
    # tied weight stays alive through the step anyway (FSDP2's root), see `rl.backends.tied_grad`.
    defer_tied_head_grad = False

    def __init__(self, spec: ModelSpec, dist_info: DistInfo):
        self.spec = spec
        self.dist = dist_info
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.sp: SequenceParallel | None = None  # set by a strategy that runs Ulysses (`use_sequence_parallel`)

    @property
    def trainable(self) -> bool:
        return self.spec.role in ("policy", "critic")

    @property
    def is_critic(self) -> bool:
        return self.spec.role == "critic"

    def load_model(self, sequence_parallel: bool = False) -> nn.Module:
        """The Hugging Face model at spec.path on this rank's device; a critic with its value head."""
        from rl.backends.hf_model import load_causal_lm

        model = load_causal_lm(self.spec.path, self.dist.device, sequence_parallel, self.spec.flash_attn,
                               self.spec.bf16)
        if self.is_critic:
            from rl.backends.value_head import attach_value_head

            attach_value_head(model, self.spec.path)
        if self.spec.freeze_vision_tower:  # before wrapping: the optimizer is made over what requires grad
            from rl.backends.multimodal import vision_tower

            vision_tower(model).requires_grad_(False)
        if self.spec.exact:
            from rl.core.batch_invariant import make_batch_invariant

            make_batch_invariant(model)
        return model

    @property
    def logprob_kernels(self) -> str:
        """What computes the token logprobs from the logits: trainer.kernels, or the batch-invariant log-softmax."""
        from rl.core import batch_invariant

        return batch_invariant.NAME if self.spec.exact else self.spec.kernels

    # --- what a strategy implements -------------------------------------------------------------------------
    @abc.abstractmethod
    def build(self) -> None:
        """Load the Hugging Face weights from spec.path, wrap them for the strategy, make the optimizer."""

    @abc.abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Model and optimizer state of this rank (collective: every rank calls it)."""

    @abc.abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what save_checkpoint wrote (collective)."""

    @classmethod
    @abc.abstractmethod
    def checkpoint_weights(cls, path: str, model_path: str) -> dict[str, Tensor]:
        """The model weights in a checkpoint `save_checkpoint` wrote (every rank's files), under Hugging Face names
        on CPU, read in one process without a process group (`rl.launch.convert`); `model_path` is the HF model the
        run started from (its config)."""

    @abc.abstractmethod
    def full_state_dict(self) -> dict[str, Tensor]:
        """Full weights in Hugging Face naming on CPU, on rank 0 (other ranks: empty). Collective."""

    def own_state_dict(self) -> dict[str, Tensor]:
        """Full weights in the model's own naming (a LoRA layer as base, A and B), on CPU on rank 0. Collective;
        what a strategy that trains LoRA adapters implements."""
        raise NotImplementedError(f"{type(self).__name__} does not train LoRA adapters")

    def own_to_hf(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """`own_state_dict`'s tensors under Hugging Face names, LoRA adapters merged into their layers."""
        return dict(self.hf_items(state.items())) if self.spec.lora else state

    def hf_items(self, items: Iterable[tuple[str, Tensor]]) -> Iterable[tuple[str, Tensor]]:
        """A stream of (name, tensor) in the model's own naming under Hugging Face names: with LoRA, each adapted
        weight merged with its adapters (`rl.backends.lora.merged_items`); otherwise the stream as it is."""
        if not self.spec.lora:
            return items
        from rl.backends.lora import merged_items, scaling

        return merged_items(items, scaling(self.spec.lora))

    def adapter_state_dict(self) -> dict[str, Tensor]:
        """The LoRA adapters under PEFT's adapter-file names, on rank 0 (`rl.backends.lora.adapter_items`).
        Collective."""
        from rl.backends.lora import adapter_items

        return dict(adapter_items(self.own_state_dict().items()))

    def reference_view(self):
        """A context in which this (LoRA) policy computes the reference model's logprobs: its adapters off."""
        if not self.spec.lora:
            raise RuntimeError("only a LoRA policy doubles as the reference model (adapters off)")
        from rl.backends.lora import adapters_disabled

        return adapters_disabled(self.model)

    def weight_buckets(self, bucket_bytes: int) -> Iterator[Bucket]:
        """The weights for the generation engines, in buckets (`weight_sync`); collective. This default gathers
        the full state first (rank 0 holds the whole model at once); every built-in strategy overrides it to
        gather a piece at a time."""
        yield from bucketed(self.full_state_dict().items(), bucket_bytes)

    def offload(self) -> None:
        """Moves weights and optimizer state to CPU memory between phases (nothing to do when training on CPU)."""
        self._move_state(torch.device("cpu"))

    def reload(self) -> None:
        """Undoes `offload`."""
        self._move_state(self.dist.device)

    def _move_state(self, device: torch.device) -> None:
        if self.dist.device.type == "cpu":
            return
        self.model.to(device)
        for state in (self.optimizer.state.values() if self.optimizer else ()):
            for key, value in state.items():
                if isinstance(value, Tensor):
                    state[key] = value.to(device, non_blocking=True)
        if device.type == "cpu" and torch.cuda.is_available():
            torch.cuda.empty_cache()

    # --- shared by every strategy ---------------------------------------------------------------------------
    def make_optimizer(self, params) -> None:
        """AdamW with the LR warm-up schedule; torch's fused kernel where it has one (CPU and CUDA), which on CPU is
        several times faster than the default per-tensor loop, on DTensor shards too."""
        spec = self.spec
        fused = self.dist.device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.AdamW(params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay,
                                           fused=fused)
        self.scheduler = lr_schedule(self.optimizer, spec)

    def use_sequence_parallel(self, model: nn.Module) -> None:
        """Ulysses over groups of spec.sequence_parallel_size ranks for a Hugging Face `model` loaded with
        `load_causal_lm(..., sequence_parallel=True)` (collective: creates the groups)."""
        from rl.backends.ulysses import attach, sequence_parallel

        self.sp = sequence_parallel(self.spec.sequence_parallel_size, self.dist.rank, self.dist.world_size)
        if self.sp is not None:
            attach(model, self.sp)

    def forward_module(self) -> nn.Module:
        """The module whose forward runs the wrapped model (a DeepSpeed engine, an FSDP module...)."""
        return self.model

    # --- what the driver calls, once per data-parallel shard's micro-batches ----------------------------------
    def data_parallel_rank(self) -> DataParallelRank:
        """Where this worker sits among the data-parallel shards. Sharded data parallelism (FSDP, ZeRO): every
        worker is its own shard and reports its own results; with sequence parallelism a group of ranks is one
        shard and its first rank reports."""
        size = self.sp.size if self.sp is not None else 1
        return DataParallelRank(size=self.dist.world_size // size, index=self.dist.rank // size,
                                reports=self.dist.rank % size == 0)

    def logprobs_micro_batches(self, batches: list[PackedBatch], with_entropy: bool = False) -> list[Tensor] | None:
        """Per micro-batch token logprobs of this rank's shard; None on a rank that does not report them."""
        return [self.logprobs(batch, with_entropy)[0] for batch in batches]

    def values_micro_batches(self, batches: list[PackedBatch]) -> list[Tensor] | None:
        """A critic's per micro-batch values of this rank's shard (`hf_forward.batch_values`); None on a rank that
        does not report them."""
        return [self.values(batch) for batch in batches]

    @torch.no_grad()
    def values(self, batch: PackedBatch) -> Tensor:
        self.forward_module().eval()
        return batch_values(self.forward_module(), batch.to(self.dist.device), self.sp).cpu()

    def train_micro_batches(self, batches: list[PackedBatch], settings: LossSettings | ValueLossSettings,
                            normalizer: LossNormalizer) -> dict[str, float] | None:
        """Accumulates the gradients of this shard's micro-batches (the optimizer step follows); returns the
        shard's share of the mini-batch metrics (summed over shards by the driver), or None on a rank that does
        not report them."""
        totals: dict[str, float] = {}
        for i, batch in enumerate(batches):
            for name, value in self.forward_backward(batch, settings, normalizer, i == len(batches) - 1).items():
                totals[name] = totals.get(name, 0.0) + value
        return totals

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        self.forward_module().eval()
        batch, spec = batch.to(self.dist.device), self.spec
        if spec.fused_kernels and batch.num_tokens > 0:
            logprobs, entropy = hidden_logprobs(self.forward_module(), batch, spec.temperature, with_entropy,
                                                spec.fused_chunk_size)
        else:
            logprobs, entropy = batch_logprobs(self.forward_module(), batch, spec.temperature, with_entropy,
                                               self.logprob_kernels, self.sp)
        return logprobs.cpu(), (entropy.cpu() if entropy is not None else None)

    def backward(self, loss: Tensor, last_micro_batch: bool) -> None:
        loss.backward()

    def forward_backward(self, batch: PackedBatch, settings: LossSettings | ValueLossSettings,
                         normalizer: LossNormalizer, last_micro_batch: bool = True) -> dict[str, float]:
        """Adds this micro-batch's share of the mini-batch loss gradient (the policy's, or a critic's value loss
        with `ValueLossSettings`); returns its share of the metrics. `last_micro_batch` marks the end of the
        accumulation window (the optimizer step follows)."""
        real = batch.num_tokens > 0
        batch = (batch if real else placeholder_batch()).to(self.dist.device)
        self.forward_module().train()
        spec = self.spec
        if isinstance(settings, SupervisedLossSettings):  # SFT / DPO (`sft_loss`, `dpo_loss`): from token logprobs
            logprobs, _ = batch_logprobs(self.forward_module(), batch, spec.temperature, False, self.logprob_kernels,
                                         self.sp)
            loss, metrics = settings.compute(logprobs, batch, normalizer)
        elif self.is_critic:
            values = batch_values(self.forward_module(), batch, self.sp)
            loss, metrics = compute_value_loss(settings, values, batch.old_values, batch.returns, batch.loss_mask,
                                               normalizer, seq_ids=batch.token_seq_ids(),
                                               num_sequences=batch.num_sequences)
        elif spec.fused_kernels:  # the loss from hidden states and the LM-head weight, chunked (no logits)
            loss, metrics = hidden_policy_loss(self.forward_module(), batch, settings, normalizer, spec.temperature,
                                               spec.kernels, spec.fused_chunk_size, self.defer_tied_head_grad)
        else:
            logprobs, entropy = batch_logprobs(self.forward_module(), batch, spec.temperature,
                                               settings.use_entropy_loss, self.logprob_kernels, self.sp)
            loss, metrics = compute_policy_loss(
                settings, logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask, normalizer,
                ref_logprobs=batch.ref_logprobs, entropy=entropy, seq_ids=batch.token_seq_ids(),
                num_sequences=batch.num_sequences, rollout_logprobs=batch.rollout_logprobs,
            )
        # A rank with no sequences still runs forward/backward so its collectives stay in step with the others.
        self.backward((loss if real else loss * 0.0) * gradient_scale(self.sp), last_micro_batch)
        out = {name: float(value) for name, value in metrics.items()} if real else {}
        out["loss"] = float(loss.detach()) / normalizer.dp_world_size if real else 0.0
        return out

    def clip_grad_norm(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.max_grad_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def optimizer_step(self) -> dict[str, float]:
        """Clips and steps; a non-finite gradient norm (the same on every rank: it is reduced over all of them) is
        never applied: the gradients are dropped, the schedule does not advance, and `skipped_steps` says so."""
        grad_norm = self.clip_grad_norm()
        lr = self.optimizer.param_groups[0]["lr"]
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "lr": lr, "skipped_steps": float(skipped)}

    def weights_finite(self) -> bool:
        """Whether every weight this rank holds (its own shard) is finite; what a checkpoint is committed on."""
        return weights_finite(self.model.parameters())


def weights_finite(params: Iterable[Tensor]) -> bool:
    """Whether every tensor (a DTensor by its local shard) holds only finite values."""
    for param in params:
        local = param.to_local() if hasattr(param, "to_local") else param
        if local.numel() and not bool(torch.isfinite(local.detach()).all()):
            return False
    return True


def lr_schedule(optimizer: torch.optim.Optimizer, spec: ModelSpec) -> torch.optim.lr_scheduler.LambdaLR:
    """Every strategy's LR schedule (`rl.core.algorithms.lr_schedule`): the spec's warm-up, then constant or its
    decay to min_lr."""
    ratio = spec.min_lr / spec.lr if spec.lr else 0.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(
        lr_factor, warmup=spec.lr_warmup_steps, scheduler=spec.scheduler, decay_steps=spec.lr_decay_steps,
        min_ratio=ratio))


def placeholder_batch() -> PackedBatch:
    """Two tokens, nothing in the loss: what a rank without sequences runs in a step."""
    from rl.core.packing import pack_sequences

    return pack_sequences([{
        "input_ids": torch.zeros(2, dtype=torch.long), "loss_mask": torch.zeros(2, dtype=torch.bool),
        "advantages": torch.zeros(2), "old_logprobs": torch.zeros(2), "ref_logprobs": torch.zeros(2),
        "old_values": torch.zeros(2), "returns": torch.zeros(2),
    }])
