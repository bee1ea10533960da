"""Strategy `megatron`: a megatron-core GPTModel with TP/PP/EP/SP, fed the shared PackedBatch as THD sequences.

Every call runs megatron's forward-backward schedule (1F1B with PP > 1) over the model-parallel group's tokens as
one micro-batch; logprobs come from the vocab-parallel logits; the loss is `rl.core.algorithms.compute_policy_loss`.
Training uses megatron-core's own machinery on every device (optimizer.py), on CPU through cpu_compat.py: its
DistributedDataParallel grad buffers, `finalize_model_grads`, the distributed optimizer (ZeRO-1 over DP, torch AdamW
inside) and its grad norm and clipping, with the base class's LR warm-up. With `optimizer_cpu_offload` megatron's
non-distributed optimizer handles the grads and `rl.backends.host_optimizer.HostAdamW` the update (megatron's
HybridDeviceOptimizer does not work here: see optimizer.py). Checkpoints hold megatron's distributed-optimizer state
gathered over DP (checkpoint.py).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor

from rl.backends.base import TrainingBackend, placeholder_batch
from rl.backends.megatron import batches as B
from rl.backends.megatron import checkpoint as ckpt
from rl.backends.megatron import optimizer as mopt
from rl.backends.megatron.cpu_compat import cpu_compat
from rl.backends.megatron.logprobs import vocab_parallel_logprobs
from rl.backends.megatron.parallel import MegatronOptions, current_layout, init_parallel_state
from rl.core.algorithms import LossNormalizer, LossSettings, compute_policy_loss
from rl.core.packing import PackedBatch


class MegatronBackend(TrainingBackend):
    def build(self) -> None:
        with cpu_compat(self.dist.device):  # megatron-core runs only inside this scope (and _schedule's) on CPU
            self._build()

    def _build(self) -> None:
        from transformers import AutoConfig

        from rl.backends.hf_model import load_causal_lm
        from rl.backends.megatron.convert import hf_to_megatron
        from rl.backends.megatron.model import build_gpt_model, transformer_config

        self.options = MegatronOptions.from_dict(self.spec.backend_options)
        init_parallel_state(self.options, self.dist.world_size)
        self.layout = current_layout()
        self.hf_config = AutoConfig.from_pretrained(os.path.expanduser(self.spec.path))
        opts = self.options
        # trainer.gradient_checkpointing means whole-layer recompute here unless megatron_config names a granularity.
        recompute = opts.recompute_granularity or ("full" if self.spec.gradient_checkpointing else None)
        config = transformer_config(self.hf_config, self.layout, opts.sequence_parallel,
                                    recompute if self.trainable else None, opts.transformer_config_kwargs)
        from megatron.core import parallel_state as ps

        model = build_gpt_model(self.hf_config, config, self.layout, ps.is_pipeline_first_stage(),
                                ps.is_pipeline_last_stage())
        self.model = model
        weights = load_causal_lm(self.spec.path, torch.device("cpu")).state_dict()
        self._load_local(hf_to_megatron(weights, self.hf_config, self.layout))
        del weights
        self.model.to(self.dist.device)
        self.ddp = None
        if self.trainable:
            offload = self.options.optimizer_cpu_offload
            self.ddp = mopt.wrap_ddp(self.model, distributed_optimizer=not offload)
            self.optimizer = mopt.MegatronAdam(self.ddp, self.spec, offload)
            self.scheduler = self.optimizer.scheduler
        else:
            self.model.requires_grad_(False)

    def forward_module(self) -> torch.nn.Module:
        return self.ddp if self.ddp is not None else self.model

    def _load_local(self, state: dict[str, Tensor]) -> None:
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise ValueError(f"megatron weights do not match the model: missing {missing}, unexpected {unexpected}")

    # --- forward ----------------------------------------------------------------------------------------------
    def _vocab_start(self) -> int:
        return self.layout.tp_rank * self.model.vocab_size // self.layout.tp

    def _token_logprobs(self, logits: Tensor, batch: PackedBatch, with_entropy: bool):
        n = batch.num_tokens
        lp, ent = vocab_parallel_logprobs(logits[0, :n], batch.prediction_targets(), self._vocab_start(),
                                          self.hf_config.vocab_size, self.spec.temperature, with_entropy)
        return PackedBatch.align_to_targets(lp), (PackedBatch.align_to_targets(ent) if ent is not None else None)

    def _schedule(self, batch: PackedBatch, loss_func, forward_only: bool) -> list:
        """Megatron's forward-backward schedule over one micro-batch; loss_func's dicts on the last stage."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        ids, pos, params = B.thd_inputs(batch, B.pad_multiple(self.layout.tp, self.options.sequence_parallel),
                                        self.dist.device)

        def forward_step(_data_iterator, model):
            return model(ids, pos, None, packed_seq_params=params), loss_func

        with cpu_compat(self.dist.device):
            return get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter([None]), model=[self.forward_module()],
                num_microbatches=1,
                seq_length=ids.shape[1], micro_batch_size=1, forward_only=forward_only)

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        group = B.gather_group_batch(batch if batch.num_tokens else placeholder_batch())
        merged = group.batch.to(self.dist.device)
        self.model.eval()

        def loss_func(logits):
            lp, ent = self._token_logprobs(logits, merged, with_entropy)
            return logits.new_zeros(()), {"lp": lp, "ent": ent}

        out = self._schedule(merged, loss_func, forward_only=True)
        n = merged.num_tokens
        lp = B.broadcast_from_last_stage(out[0]["lp"] if out else None, (n,), self.dist.device)
        ent = None
        if with_entropy:
            ent = B.broadcast_from_last_stage(out[0]["ent"] if out else None, (n,), self.dist.device)
        mine = slice(group.start, group.start + batch.num_tokens)
        return lp[mine].float().cpu(), (ent[mine].float().cpu() if ent is not None else None)

    def forward_backward(self, batch: PackedBatch, settings: LossSettings, normalizer: LossNormalizer,
                         last_micro_batch: bool = True) -> dict[str, float]:
        group = B.gather_group_batch(batch if batch.num_tokens else placeholder_batch())
        merged = group.batch.to(self.dist.device)
        self.model.train()

        def loss_func(logits):
            lp, ent = self._token_logprobs(logits, merged, settings.use_entropy_loss)
            loss, metrics = compute_policy_loss(
                settings, lp, merged.old_logprobs, merged.advantages, merged.loss_mask, normalizer,
                ref_logprobs=merged.ref_logprobs, entropy=ent, seq_ids=merged.token_seq_ids(),
                num_sequences=merged.num_sequences)
            report = {name: float(value) for name, value in metrics.items()}
            report["loss"] = float(loss.detach()) / normalizer.dp_world_size
            # The loss undoes a gradient average over the normalizer's dp_world_size workers; megatron's DDP averages
            # over its own DP replicas (world / (TP * PP): each ran a TP * PP group's tokens), so rescale to those.
            return loss * (self._megatron_dp_size() / normalizer.dp_world_size), report

        out = self._schedule(merged, loss_func, forward_only=False)
        report = [out[0] if out else None]
        from megatron.core import parallel_state as ps

        if ps.get_pipeline_model_parallel_world_size() > 1:
            dist.broadcast_object_list(report, src=ps.get_pipeline_model_parallel_last_rank(),
                                       group=ps.get_pipeline_model_parallel_group())
        # Every rank of the model-parallel group ran the group's tokens: each reports its 1/size share.
        return {name: value / group.group_size for name, value in report[0].items()}

    @staticmethod
    def _megatron_dp_size() -> int:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_world_size(with_context_parallel=True)

    # --- optimizer --------------------------------------------------------------------------------------------
    def clip_grad_norm(self) -> float:
        with cpu_compat(self.dist.device):
            return self.optimizer.reduce_and_clip(self.spec.max_grad_norm)

    def optimizer_step(self) -> dict[str, float]:
        lr = self.optimizer.lr
        grad_norm = self.clip_grad_norm()
        with cpu_compat(self.dist.device):
            self.optimizer.step()
        return {"grad_norm": grad_norm, "lr": lr}

    def _move_state(self, device: torch.device) -> None:
        """GPU only: megatron's DDP buffers hold the weights (with the distributed optimizer) and the grads, so they
        move through megatron's buffer offload, which keeps the parameters' views into them valid."""
        if self.dist.device.type == "cpu" or self.ddp is None:
            super()._move_state(device)
            return
        to_host = device.type == "cpu"
        for buffer in self.ddp.buffers + self.ddp.expert_parallel_buffers:
            if to_host:
                buffer.offload_to_cpu()
            else:
                buffer.reload_from_cpu()
        if not self.ddp.ddp_config.use_distributed_optimizer:  # the weights are not in the buffers then
            self.model.to(device)
        self.optimizer.move_state(device)
        if to_host:
            torch.cuda.empty_cache()

    # --- checkpoints and export -------------------------------------------------------------------------------
    def save_checkpoint(self, path: str) -> None:
        with cpu_compat(self.dist.device):
            state = {"model": ckpt.model_state(self.model), **self.optimizer.state_dict()}
        ckpt.save_distributed(path, self.layout, state)
        if self.dist.is_main:  # lets `rl.launch.convert --direction=megatron_to_hf` read training checkpoints
            from rl.backends.megatron.hf_io import write_layout

            write_layout(path, self.layout, os.path.expanduser(self.spec.path))

    def load_checkpoint(self, path: str) -> None:
        state = ckpt.read_shard(path, self.layout)
        self._load_local(state["model"])
        if self.optimizer is not None:
            with cpu_compat(self.dist.device):
                self.optimizer.load_state_dict(state)

    def full_state_dict(self) -> dict[str, Tensor]:
        from rl.backends.megatron.convert import megatron_to_hf

        shards = ckpt.gather_shards(self.model, self.layout)
        if shards is None:
            return {}
        layout = self.layout
        return megatron_to_hf(shards, self.hf_config, layout.tp, layout.pp, layout.ep)
