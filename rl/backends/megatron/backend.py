"""Strategy `megatron`: a megatron-core GPTModel with TP/PP/EP/SP, fed the shared PackedBatch as THD sequences.

The TP x PP ranks of a model-parallel group form one data-parallel shard (`data_parallel_rank`): the driver sends them
the same micro-batches, and each call runs megatron's forward-backward schedule over all of them (1F1B overlap of the
stages with PP > 1); logprobs come from the vocab-parallel logits; the loss is `rl.core.algorithms.compute_policy_loss`.
A critic (role "critic") has a value head in place of the output layer (critic.py) and trains on `compute_value_loss`.
Training uses megatron-core's own machinery on every device (optimizer.py), on CPU through cpu_compat.py: its
DistributedDataParallel grad buffers, `finalize_model_grads`, the distributed optimizer (ZeRO-1 over DP, torch AdamW
inside) and its grad norm and clipping, with the base class's LR warm-up. With `optimizer_cpu_offload` megatron's
non-distributed optimizer handles the grads and `rl.backends.host_optimizer.HostAdamW` the update (megatron's
HybridDeviceOptimizer does not work here: see optimizer.py). Checkpoints hold megatron's distributed-optimizer state
gathered over DP (checkpoint.py). With LoRA (`trainer.policy.model.lora`) the base is frozen and adapters sit on
the tensor-parallel linear layers (lora.py): checkpoints hold the adapters, engines and exports get merged weights.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Iterator

import torch
from torch import Tensor

from rl.backends.base import DataParallelRank, TrainingBackend, placeholder_batch
from rl.backends.megatron import batches as B
from rl.backends.megatron import checkpoint as ckpt
from rl.backends.megatron import optimizer as mopt
from rl.backends.megatron.config import MegatronConfig
from rl.backends.megatron.context_parallel import context_parallel, local_inputs, positional_rotary, whole_row
from rl.backends.megatron.cpu_compat import cpu_compat
from rl.backends.megatron.critic import attach_value_heads, refuse_unsupported, token_values, train_value_heads
from rl.backends.megatron.fused import fused_policy_loss, output_layer_yields_hidden
from rl.backends.megatron.logprobs import vocab_parallel_logprobs
from rl.backends.megatron.parallel import current_layout, init_parallel_state
from rl.backends.precision import bf16_compute
from rl.backends.ulysses import gradient_scale
from rl.backends.weight_sync import Bucket, rank0_buckets
from rl.core.algorithms import LossNormalizer, LossSettings, compute_policy_loss
from rl.core.algorithms.sft_loss import SupervisedLossSettings
from rl.core.algorithms.value_loss import ValueLossSettings, compute_value_loss
from rl.core.packing import PackedBatch


class MegatronBackend(TrainingBackend):
    def build(self) -> None:
        with cpu_compat(self.dist.device):  # megatron-core runs only inside this scope (and _schedule's) on CPU
            self._build()

    def _build(self) -> None:
        from transformers import AutoConfig

        from rl.backends.megatron.convert import hf_to_megatron
        from rl.backends.megatron.model import build_gpt_model, transformer_config

        if self.is_critic:
            refuse_unsupported(self.spec)
        self.options = MegatronConfig.from_options(self.spec.backend_options)
        init_parallel_state(self.options, self.dist.world_size, timeout_s=self.dist.timeout_s)
        self.layout = current_layout()
        self.hf_config = AutoConfig.from_pretrained(os.path.expanduser(self.spec.path))
        if self.is_critic:  # the value head is no output embedding
            self.hf_config.tie_word_embeddings = False
        opts = self.options
        # trainer.gradient_checkpointing means whole-layer recompute here unless megatron_config names a granularity.
        recompute = opts.recompute_granularity or ("full" if self.spec.gradient_checkpointing else None)
        config = transformer_config(self.hf_config, self.layout, opts.sequence_parallel,
                                    recompute if self.trainable else None, opts.transformer_config_kwargs)
        # One model chunk per virtual pipeline stage (VP of them with the interleaved schedule; one otherwise).
        self.chunks = [build_gpt_model(self.hf_config, config, self.layout, k) for k in range(self.layout.vp)]
        if self.is_critic:
            attach_value_heads(self.chunks, self.layout.chunks(), self.hf_config.hidden_size, opts.sequence_parallel)
        self.model = self.chunks[0] if len(self.chunks) == 1 else torch.nn.ModuleList(self.chunks)
        self.cp = context_parallel(opts.context_parallel_size)
        if self.cp is not None:
            if self.spec.fused_kernels:
                raise ValueError("trainer.policy.use_fused_kernels does not run with context parallelism yet")
            for chunk in self.chunks:
                positional_rotary(chunk)
        weights, adapters = self._hf_weights()
        self.adapters: list = []
        for chunk, layout in zip(self.chunks, self.layout.chunks(), strict=True):
            self._load_local(chunk, hf_to_megatron(weights, self.hf_config, layout, self.is_critic))
            if self.spec.lora:
                from rl.backends.lora import scaling
                from rl.backends.megatron.lora import attach

                self.adapters += attach(chunk, adapters, self.hf_config, layout, scaling(self.spec.lora),
                                        opts.sequence_parallel)
        del weights, adapters
        if self.is_critic and self.spec.lora:
            train_value_heads(self.chunks)
        self.model.to(self.dist.device)
        self.ddp: list = []
        if self.trainable:
            offload = self.options.optimizer_cpu_offload
            self.ddp = [mopt.wrap_ddp(chunk, distributed_optimizer=not offload) for chunk in self.chunks]
            self.optimizer = mopt.MegatronAdam(self.ddp, self.spec, offload)
            self.scheduler = self.optimizer.scheduler
        else:
            self.model.requires_grad_(False)

    def _hf_weights(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The HF model's weights (a critic's with the value head every strategy starts from, as `lm_head.*`) and,
        with LoRA, the adapters PEFT puts on it (its targets, its initial values, so that every strategy starts a
        LoRA run from the same adapters)."""
        from rl.backends.hf_model import load_causal_lm
        from rl.backends.lora import BASE_LAYER, add_lora, is_adapter

        model = load_causal_lm(self.spec.path, torch.device("cpu"))
        if self.is_critic:
            from rl.backends.value_head import attach_value_head

            attach_value_head(model, self.spec.path)
        if not self.spec.lora:
            return model.state_dict(), {}
        add_lora(model, self.spec.lora, self.spec.path)
        state = model.state_dict()
        return ({name.replace(BASE_LAYER, "."): t for name, t in state.items() if not is_adapter(name)},
                {name: t for name, t in state.items() if is_adapter(name)})

    def _scheduled_chunks(self) -> list[torch.nn.Module]:
        return self.ddp or self.chunks

    @staticmethod
    def _load_local(chunk: torch.nn.Module, state: dict[str, Tensor], adapters_only: bool = False) -> None:
        from rl.backends.megatron.lora import is_adapter_key

        missing, unexpected = chunk.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state") and (is_adapter_key(k) or not adapters_only)]
        if missing or unexpected:
            raise ValueError(f"megatron weights do not match the model: missing {missing}, unexpected {unexpected}")

    # --- forward ----------------------------------------------------------------------------------------------
    def _vocab_start(self) -> int:
        return self.layout.tp_rank * self.chunks[0].vocab_size // self.layout.tp

    def _token_logprobs(self, logits: Tensor, batch: PackedBatch, with_entropy: bool):
        n, targets = batch.num_tokens, batch.prediction_targets()
        if self.cp is None:
            lp, ent = vocab_parallel_logprobs(logits[0, :n], targets, self._vocab_start(), self.hf_config.vocab_size,
                                              self.spec.temperature, with_entropy)
        else:  # this rank's slice of the row scored, the whole row assembled over the CP group
            local = logits.shape[1]
            start, length = self.cp.rank * local, local * self.cp.size
            mine = torch.nn.functional.pad(targets, (0, length - n))[start:start + local]
            lp, ent = vocab_parallel_logprobs(logits[0], mine, self._vocab_start(), self.hf_config.vocab_size,
                                              self.spec.temperature, with_entropy)
            lp = whole_row(lp, start, length, self.cp)[:n]
            ent = whole_row(ent, start, length, self.cp)[:n] if ent is not None else None
        return PackedBatch.align_to_targets(lp), (PackedBatch.align_to_targets(ent) if ent is not None else None)

    def _micro_batches(self, batches: list[PackedBatch]) -> tuple[list[PackedBatch], list[bool]]:
        """(`batches` on the device with placeholders for empty ones, which of them are real); with the
        interleaved schedule placeholders pad them to a multiple of PP (its rule: whole groups of PP micro-batches
        per model chunk)."""
        multiple = self.layout.pp if self.layout.vp > 1 else 1
        real = [b.num_tokens > 0 for b in batches] + [False] * (-len(batches) % multiple)
        batches = batches + [placeholder_batch()] * (len(real) - len(batches))
        return [(b if b.num_tokens else placeholder_batch()).to(self.dist.device) for b in batches], real

    def _schedule(self, batches: list[PackedBatch], loss_func, forward_only: bool) -> list:
        """Megatron's forward-backward schedule over all `batches` as its micro-batches (1F1B overlap of the stages
        with PP > 1, interleaved over the model chunks with VP > 1); `loss_func(i, logits)` scores micro-batch i.
        Returns its results on the last stage."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        cp = self.cp.size if self.cp is not None else 1
        lengths = B.padded_lengths(batches, B.pad_multiple(self.layout.tp, self.options.sequence_parallel) * cp,
                                   same=self.layout.pp > 1)
        inputs = [B.thd_inputs(batch, length, self.dist.device) for batch, length in zip(batches, lengths,
                                                                                           strict=True)]
        if self.cp is not None:
            inputs = [local_inputs(*whole, self.cp) for whole in inputs]

        def forward_step(data_iterator, model):
            i = next(data_iterator)
            ids, pos, params = inputs[i]
            return model(ids, pos, None, packed_seq_params=params), functools.partial(loss_func, i)

        chunks = self._scheduled_chunks()
        # Each model chunk walks the micro-batches in order (the interleaved schedule takes one iterator per chunk).
        order = [iter(range(len(batches))) for _ in chunks]
        # trainer.bf16: bf16 autocast over the schedule, its backward included (megatron's linear layers compute
        # their input gradients from the forward's casts only under CUDA autocast), fp32 weights, grads and logprobs.
        bf16 = torch.autocast(self.dist.device.type, torch.bfloat16, enabled=bf16_compute(self.spec.bf16,
                                                                                          self.dist.device))
        with cpu_compat(self.dist.device), bf16:
            return get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=order if len(chunks) > 1 else order[0], model=chunks,
                num_microbatches=len(batches), seq_length=max(lengths) // cp, micro_batch_size=1,
                forward_only=forward_only)

    def data_parallel_rank(self) -> DataParallelRank:
        """TP x PP (x CP) ranks share one data-parallel shard; its last pipeline stage's first TP (and CP) rank
        reports."""
        from megatron.core import parallel_state as ps

        cp = self.cp.size if self.cp is not None else 1
        first_of_cp = self.cp is None or self.cp.rank == 0
        return DataParallelRank(size=ps.get_data_parallel_world_size() // cp, index=ps.get_data_parallel_rank() // cp,
                                reports=ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
                                and first_of_cp)

    @torch.no_grad()
    def _forward_only(self, batches: list[PackedBatch], score) -> list[dict] | None:
        """`score(output, batch)` of each micro-batch (a dict of CPU tensors) on the reporting rank, None on the
        others; `output` is the last stage's (vocab-parallel logits, or a critic's values)."""
        count, (batches, _) = len(batches), self._micro_batches(batches)
        self.model.eval()

        def loss_func(i, output):
            return output.new_zeros(()), score(output, batches[i])

        out = self._schedule(batches, loss_func, forward_only=True)
        return out[:count] if self.data_parallel_rank().reports else None

    def _logprobs_only(self, batches: list[PackedBatch], with_entropy: bool) -> list[dict] | None:
        def score(logits, batch):
            lp, ent = self._token_logprobs(logits, batch, with_entropy)
            return {"lp": lp.float().cpu(), "ent": ent.float().cpu() if with_entropy else None}

        return self._forward_only(batches, score)

    def logprobs_micro_batches(self, batches: list[PackedBatch], with_entropy: bool = False) -> list[Tensor] | None:
        out = self._logprobs_only(batches, with_entropy)
        return None if out is None else [o["lp"][:b.num_tokens] for o, b in zip(out, batches, strict=True)]

    def logprobs(self, batch: PackedBatch, with_entropy: bool = False) -> tuple[Tensor | None, Tensor | None]:
        """One micro-batch's (logprobs, entropy) on the reporting rank; (None, None) on the others."""
        out = self._logprobs_only([batch], with_entropy)
        if out is None:
            return None, None
        n = batch.num_tokens
        return out[0]["lp"][:n], (out[0]["ent"][:n] if with_entropy else None)

    def values_micro_batches(self, batches: list[PackedBatch]) -> list[Tensor] | None:
        """A critic's [N] values per micro-batch (`critic.token_values`) on the reporting rank; None on the others."""
        out = self._forward_only(batches, lambda output, batch: {"v": token_values(output, batch, self.cp).cpu()})
        return None if out is None else [o["v"][:b.num_tokens] for o, b in zip(out, batches, strict=True)]

    def values(self, batch: PackedBatch) -> Tensor | None:
        """One micro-batch's values on the reporting rank; None on the others."""
        out = self.values_micro_batches([batch])
        return None if out is None else out[0]

    def train_micro_batches(self, batches: list[PackedBatch], settings: LossSettings | ValueLossSettings,
                            normalizer: LossNormalizer) -> dict[str, float] | None:
        """The policy loss, or a critic's value loss with `ValueLossSettings`, over the micro-batches."""
        batches, real = self._micro_batches(batches)
        self.model.train()
        fused, seen = self.spec.fused_kernels, {}

        def loss_func(i, output):
            batch = batches[i]
            if isinstance(settings, SupervisedLossSettings):  # SFT / DPO (`sft_loss`, `dpo_loss`)
                loss, metrics = settings.compute(self._token_logprobs(output, batch, False)[0], batch, normalizer)
            elif self.is_critic:
                loss, metrics = compute_value_loss(
                    settings, token_values(output, batch, self.cp), batch.old_values, batch.returns, batch.loss_mask,
                    normalizer, seq_ids=batch.token_seq_ids(), num_sequences=batch.num_sequences)
            elif fused:  # `output` holds the final hidden states (fused.output_layer_yields_hidden)
                loss, metrics = self._fused_loss(output[0, :batch.num_tokens], seen["weight"], batch, settings,
                                                 normalizer)
            else:
                lp, ent = self._token_logprobs(output, batch, settings.use_entropy_loss)
                loss, metrics = compute_policy_loss(
                    settings, lp, batch.old_logprobs, batch.advantages, batch.loss_mask, normalizer,
                    ref_logprobs=batch.ref_logprobs, entropy=ent, seq_ids=batch.token_seq_ids(),
                    num_sequences=batch.num_sequences, rollout_logprobs=batch.rollout_logprobs)
            report = {name: float(value) for name, value in metrics.items()} if real[i] else {}
            report["loss"] = float(loss.detach()) / normalizer.dp_world_size if real[i] else 0.0
            # The loss is already this micro-batch's share of the mini-batch loss (normalised by the plan over every
            # shard); the schedule divides each micro-batch's loss by their number, which this undoes. Megatron's
            # DDP averages the gradients over the normalizer's dp_world_size shards, which the loss undoes; the CP
            # ranks, which megatron counts as data-parallel ones, computed parts of one gradient.
            return loss * (len(batches) * gradient_scale(self.cp) if real[i] else 0.0), report

        with output_layer_yields_hidden(self.chunks[-1], seen) if fused else contextlib.nullcontext():
            out = self._schedule(batches, loss_func, forward_only=False)
        if not self.data_parallel_rank().reports:
            return None
        totals: dict[str, float] = {}
        for report in out:
            for name, value in report.items():
                totals[name] = totals.get(name, 0.0) + value
        return totals

    def _fused_loss(self, hidden: Tensor, weight: Tensor, batch: PackedBatch, settings: LossSettings,
                    normalizer: LossNormalizer):
        from megatron.core import parallel_state as ps

        return fused_policy_loss(hidden, weight, batch, settings, normalizer, vocab_start=self._vocab_start(),
                                 vocab_size=self.hf_config.vocab_size, group=ps.get_tensor_model_parallel_group(),
                                 temperature=self.spec.temperature, chunk_size=self.spec.fused_chunk_size)

    def forward_backward(self, batch: PackedBatch, settings: LossSettings | ValueLossSettings,
                         normalizer: LossNormalizer, last_micro_batch: bool = True) -> dict[str, float]:
        """One micro-batch; its metrics on the reporting rank, {} on the others."""
        return self.train_micro_batches([batch], settings, normalizer) or {}

    # --- optimizer --------------------------------------------------------------------------------------------
    def clip_grad_norm(self) -> float:
        with cpu_compat(self.dist.device):
            return self.optimizer.reduce_and_clip(self.spec.max_grad_norm)

    def optimizer_step(self) -> dict[str, float]:
        lr = self.optimizer.lr
        grad_norm = self.clip_grad_norm()  # reduced over every rank: they all skip a non-finite one together
        skipped = not math.isfinite(grad_norm)
        with cpu_compat(self.dist.device):
            if skipped:
                self.optimizer.drop_grads()
            else:
                self.optimizer.step()
        return {"grad_norm": grad_norm, "lr": lr, "skipped_steps": float(skipped)}

    def _move_state(self, device: torch.device) -> None:
        """GPU only: megatron's DDP buffers hold the weights (with the distributed optimizer) and the grads, so they
        move through megatron's buffer offload, which keeps the parameters' views into them valid."""
        if self.dist.device.type == "cpu" or not self.ddp:
            super()._move_state(device)
            return
        to_host = device.type == "cpu"
        for buffer in (b for chunk in self.ddp for b in chunk.buffers + chunk.expert_parallel_buffers):
            if to_host:
                buffer.offload_to_cpu()
            else:
                buffer.reload_from_cpu()
        if not self.ddp[0].ddp_config.use_distributed_optimizer:  # the weights are not in the buffers then
            self.model.to(device)
        self.optimizer.move_state(device)
        if to_host:
            torch.cuda.empty_cache()

    # --- LoRA -------------------------------------------------------------------------------------------------
    def reference_view(self):
        if not self.spec.lora:
            return super().reference_view()
        from rl.backends.megatron.lora import disabled

        return disabled(self.adapters)

    def _weights(self) -> list[dict[str, Tensor]]:
        """Each chunk's local weights for the engines and exports: with LoRA, adapters merged into their layers."""
        states = ckpt.chunk_states(self.chunks)
        if not self.spec.lora:
            return states
        from rl.backends.megatron.lora import merged

        return [merged(state, chunk) for state, chunk in zip(states, self.chunks, strict=True)]

    def adapter_state_dict(self) -> dict[str, Tensor]:
        """The adapters under PEFT's names on rank 0, each gathered from its TP shards (collective)."""
        from rl.backends.lora import adapter_items
        from rl.backends.megatron.lora import adapter_state, to_hf

        shards = ckpt.gather_shards([adapter_state(s) for s in ckpt.chunk_states(self.chunks)], self.layout)
        if shards is None:
            return {}
        layout = self.layout
        return dict(adapter_items(to_hf(shards, self.hf_config, layout.tp, layout.pp * layout.vp)))

    # --- checkpoints and export -------------------------------------------------------------------------------
    def save_checkpoint(self, path: str) -> None:
        """With LoRA the shard files hold the adapters only (and adapter_config.json their shape)."""
        from rl.backends.megatron.lora import adapter_state

        states = [{"model": adapter_state(state, self.is_critic) if self.spec.lora else state}
                  for state in ckpt.chunk_states(self.chunks)]
        with cpu_compat(self.dist.device):
            states[0].update(self.optimizer.state_dict(), pipeline=self._pipeline())
        ckpt.save_distributed(path, self.layout, states)
        if self.dist.is_main:  # lets `rl.launch.convert --direction=megatron_to_hf` read training checkpoints
            from rl.backends.megatron.hf_io import write_layout

            write_layout(path, self.layout, os.path.expanduser(self.spec.path), self.is_critic)
            if self.spec.lora:
                from rl.backends.lora import write_adapter_config

                write_adapter_config(path, self.spec.lora, self.spec.path)

    @classmethod
    def checkpoint_weights(cls, path: str, model_path: str) -> dict[str, Tensor]:
        from rl.backends.megatron.hf_io import megatron_weights

        return megatron_weights(path, model_path)

    def _pipeline(self) -> dict[str, int]:
        return {"pp": self.layout.pp, "vp": self.layout.vp}

    def load_checkpoint(self, path: str) -> None:
        states = ckpt.read_chunks(path, self.layout)
        for chunk, state in zip(self.chunks, states, strict=True):
            self._load_local(chunk, state["model"], adapters_only=bool(self.spec.lora))
        if self.optimizer is not None:
            saved = states[0].get("pipeline", {"pp": self.layout.pp * self.layout.vp, "vp": 1})
            if "optimizer" in states[0] and saved != self._pipeline():
                raise ValueError(f"{path}: its optimizer state was saved with PP={saved['pp']}, VP={saved['vp']}; "
                                 f"this run has PP={self.layout.pp}, VP={self.layout.vp} "
                                 "(trainer.policy.megatron_config): resume with those sizes")
            with cpu_compat(self.dist.device):
                self.optimizer.load_state_dict(states[0])

    def weight_buckets(self, bucket_bytes: int) -> Iterator[Bucket]:
        """One decoder layer at a time: the ranks holding its TP/EP shards (data-parallel rank 0 of each) send
        them to rank 0 (`gather_object`, collective), which merges them into HF tensors; then the embedding, the
        final norm and the LM head. Rank 0 never holds more than a layer's shards and a bucket."""
        yield from rank0_buckets(self._hf_tensors(), bucket_bytes, self.dist.is_main)

    def _hf_tensors(self) -> Iterator[tuple[str, Tensor]]:
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        from rl.backends.megatron.convert import hf_edges, hf_layer

        layout, cfg = self.layout, self.hf_config
        per_chunk = layout.layers_per_stage(cfg.num_hidden_layers)
        sends = ps.get_data_parallel_rank() == 0  # replicas hold the same shards
        layers: dict[int, dict[str, Tensor]] = {}
        edges: dict[str, dict[str, Tensor]] = {"first": {}, "last": {}}
        for chunk, state in zip(layout.chunks(), self._weights(), strict=True):
            for key, tensor in state.items() if sends else ():
                if key.startswith("decoder.layers."):
                    local, rest = key[len("decoder.layers."):].split(".", 1)
                    layers.setdefault(chunk.pp_rank * per_chunk + int(local), {})[f"decoder.layers.0.{rest}"] = tensor
                else:
                    edges["first" if key.startswith("embedding.") else "last"][key] = tensor
        coords = (layout.tp_rank, layout.ep_rank)

        def gathered(part: dict) -> dict[tuple[int, int], dict[str, Tensor]]:
            everyone: list | None = [None] * dist.get_world_size() if self.dist.is_main else None
            dist.gather_object((coords, part), everyone, dst=0)
            merged: dict[tuple[int, int], dict[str, Tensor]] = {}
            for where, piece in everyone or ():
                merged.setdefault(where, {}).update(piece)
            return merged

        for index in range(cfg.num_hidden_layers):
            shards = gathered(layers.pop(index, {}))
            if self.dist.is_main:
                yield from ((n, t.contiguous()) for n, t in hf_layer(shards, cfg, index, layout.tp, layout.ep).items())
        first, last = gathered(edges["first"]), gathered(edges["last"])
        if self.dist.is_main:
            yield from ((n, t.contiguous()) for n, t in hf_edges(first, last, cfg, layout.tp, self.is_critic).items())

    def full_state_dict(self) -> dict[str, Tensor]:
        from rl.backends.megatron.convert import megatron_to_hf

        shards = ckpt.gather_shards(self._weights(), self.layout)
        if shards is None:
            return {}
        layout = self.layout
        return megatron_to_hf(shards, self.hf_config, layout.tp, layout.pp * layout.vp, layout.ep, self.is_critic)
