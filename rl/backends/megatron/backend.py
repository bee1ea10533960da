"""Strategy `megatron`: a megatron-core GPTModel with TP/PP/EP/SP, fed the shared PackedBatch as THD sequences.

Every call runs megatron's forward-backward schedule (1F1B with PP > 1) over the model-parallel group's tokens as
one micro-batch; logprobs come from the vocab-parallel logits; the loss is `rl.core.algorithms.compute_policy_loss`.
Optimizer: a torch AdamW over each rank's shards (the base class's; with `optimizer_cpu_offload` its masters and
state stay in host memory, `rl.backends.host_optimizer`), after `grads.reduce_gradients` and a global grad norm
(`grads.clip_gradients`); megatron's own optimizers need CUDA (see cpu_compat.py).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor

from rl.backends.base import BACKENDS, TrainingBackend, _placeholder_batch
from rl.backends.host_optimizer import HostAdamW
from rl.backends.megatron import batches as B
from rl.backends.megatron import checkpoint as ckpt
from rl.backends.megatron.cpu_compat import cpu_compat
from rl.backends.megatron.grads import clip_gradients, reduce_gradients
from rl.backends.megatron.logprobs import vocab_parallel_logprobs
from rl.backends.megatron.parallel import MegatronOptions, current_layout, init_parallel_state
from rl.core.algorithms import LossNormalizer, LossSettings, compute_policy_loss
from rl.core.packing import PackedBatch


@BACKENDS.register("megatron")
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
        config = transformer_config(self.hf_config, self.layout, opts.sequence_parallel,
                                    opts.recompute_granularity if self.trainable else None,
                                    opts.transformer_config_kwargs)
        from megatron.core import parallel_state as ps

        model = build_gpt_model(self.hf_config, config, self.layout, ps.is_pipeline_first_stage(),
                                ps.is_pipeline_last_stage())
        self.model = model
        weights = load_causal_lm(self.spec.path, torch.device("cpu")).state_dict()
        self._load_local(hf_to_megatron(weights, self.hf_config, self.layout))
        del weights
        self.model.to(self.dist.device)
        if self.trainable:
            self.make_optimizer(self.model.parameters(), on_host=self.options.optimizer_cpu_offload)
        else:
            self.model.requires_grad_(False)

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
                forward_step_func=forward_step, data_iterator=iter([None]), model=[self.model], num_microbatches=1,
                seq_length=ids.shape[1], micro_batch_size=1, forward_only=forward_only)

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch, with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        group = B.gather_group_batch(batch if batch.num_tokens else _placeholder_batch())
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
        group = B.gather_group_batch(batch if batch.num_tokens else _placeholder_batch())
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
            # The loss carries x dp_world_size to undo a DP average; grads.reduce_gradients sums instead.
            return loss / normalizer.dp_world_size, report

        out = self._schedule(merged, loss_func, forward_only=False)
        report = [out[0] if out else None]
        from megatron.core import parallel_state as ps

        if ps.get_pipeline_model_parallel_world_size() > 1:
            dist.broadcast_object_list(report, src=ps.get_pipeline_model_parallel_last_rank(),
                                       group=ps.get_pipeline_model_parallel_group())
        # Every rank of the model-parallel group ran the group's tokens: each reports its 1/size share.
        return {name: value / group.group_size for name, value in report[0].items()}

    # --- optimizer --------------------------------------------------------------------------------------------
    def clip_grad_norm(self) -> float:
        reduce_gradients(self.model)
        return clip_gradients(self.model, self.spec.max_grad_norm)

    # --- checkpoints and export -------------------------------------------------------------------------------
    def save_checkpoint(self, path: str) -> None:
        state = {"model": ckpt.model_state(self.model), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict()}
        ckpt.save_distributed(path, self.layout, state)
        if self.dist.is_main:  # lets `rl.launch.convert --direction=megatron_to_hf` read training checkpoints
            from rl.backends.megatron.hf_io import write_layout

            write_layout(path, self.layout, os.path.expanduser(self.spec.path))

    def load_checkpoint(self, path: str) -> None:
        state = ckpt.read_shard(path, self.layout)
        self._load_local(state["model"])
        if "optimizer" in state and self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        elif isinstance(self.optimizer, HostAdamW):  # weights only: host masters follow the loaded weights
            self.optimizer.resync_masters()

    def full_state_dict(self) -> dict[str, Tensor]:
        from rl.backends.megatron.convert import megatron_to_hf

        shards = ckpt.gather_shards(self.model, self.layout)
        if shards is None:
            return {}
        layout = self.layout
        return megatron_to_hf(shards, self.hf_config, layout.tp, layout.pp, layout.ep)
