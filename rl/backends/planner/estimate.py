"""The per-GPU estimate of one layout: its terms, the phases of a step and the peak.

Phases (each the bytes on the busiest GPU while it runs):
- `train`: what stays (the policy's weights and optimizer state, the reference's weights, the critic's state, the
  runtime allowance) + the gathered units and gradient buffers + the larger of (activations of a training
  micro-batch and its logits, or the fused loss's chunk) and the gradients: backward frees each layer's activations
  as it makes that layer's gradients, so the first peak is at its start (all activations, the logits and their
  gradient) and the second at its end (all gradients); megatron's gradient buffers persist, so there both add;
- `critic`: the same with the critic training instead of the policy;
- `logprobs`: what stays + a forward-only pass of the policy, the reference or the critic (one layer's activations
  at a time, the logits of a forward micro-batch);
- `optimizer`: what stays + the gradients and what the optimizer step adds (DeepSpeed's flattened copy of the
  gradient partition);
- `generate`: what stays + the colocated engine (vLLM claims `gpu_memory_utilization` of the GPU while it
  generates; the HF engine in the driver holds a copy of the weights and the KV cache of a rollout batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import rl.backends.planner.terms as terms
from rl.backends.planner.inputs import PlanInputs
from rl.backends.planner.layout import Knobs, Layout
from rl.backends.planner.shape import ModelShape
from rl.backends.planner.state import Counts, ModelState, counts, model_state

TERMS = ("params", "grads", "optimizer", "gathered", "activations", "logits", "ref", "critic", "engine", "runtime")


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    knobs: Knobs
    terms: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    excluded: str | None = None
    """Why the layout cannot run here at all (a size that does not divide, an option the strategy lacks)."""
    notes: tuple[str, ...] = ()
    engine_problem: str | None = None
    """Why the colocated engine cannot start whatever the layout (its claim does not hold its weights and one
    sequence's KV cache); such an estimate does not fit."""

    @property
    def label(self) -> str:
        return self.knobs.label()

    @property
    def peak(self) -> float:
        return max(self.phases.values()) if self.phases else 0.0

    @property
    def phase(self) -> str:
        return max(self.phases, key=self.phases.get) if self.phases else ""

    def fits(self, gpu_bytes: float | None) -> bool | None:
        """Whether the peak fits one GPU (None: memory unknown, or the layout is excluded)."""
        if self.excluded or gpu_bytes is None:
            return None
        return self.peak <= gpu_bytes and self.engine_problem is None


def activation_bytes(inputs: PlanInputs, knobs: Knobs, shape: ModelShape, tokens: float) -> float:
    """Activations a training micro-batch of `tokens` saves on one rank: terms.layer_activation_bytes per layer,
    terms.model_activation_bytes for the rest (see `_hf_activations` and `_megatron_activations`)."""
    if knobs.strategy == "megatron":
        return _megatron_activations(inputs, knobs, shape, tokens)
    return _hf_activations(inputs, knobs, shape, tokens)


def _hf_activations(inputs: PlanInputs, knobs: Knobs, shape: ModelShape, tokens: float) -> float:
    """fsdp, fsdp2, deepspeed: Ulysses splits the tokens over its group; gradient checkpointing keeps each layer's
    input and recomputes one layer at a time."""
    c = inputs.compute_bytes
    moe_layers, dense_layers = shape.moe_layers, shape.layers - shape.moe_layers
    rank, targets = inputs.lora_rank, inputs.lora_targets
    full = [terms.layer_activation_bytes(shape, c, inputs.attention, moe, trainable=rank == 0,
                                         adapters=rank * shape.lora_linears(targets, moe)) for moe in (False, True)]
    if knobs.checkpointing:
        recomputed = max(full[1] if moe_layers else 0, full[0] if dense_layers else 0)
        layers = shape.layers * terms.checkpointed_layer_bytes(shape, c) + recomputed
    else:
        layers = dense_layers * full[0] + moe_layers * full[1]
    per_rank = tokens / max(inputs.ulysses, 1)
    return per_rank * (layers + terms.model_activation_bytes(shape, c, inputs.scored_fraction, rank == 0))


def micro_batches_per_shard(inputs: PlanInputs, knobs: Knobs) -> int:
    """Micro-batches one data-parallel shard runs per optimizer step (mini-batch sequences over micro-batch size x
    DP); when the config does not say, as many as there are pipeline stages."""
    dp = max(inputs.world // max(knobs.model_parallel, 1), 1)
    if inputs.mini_batch_sequences and inputs.micro_batch_sequences:
        return max(inputs.mini_batch_sequences // (inputs.micro_batch_sequences * dp), 1)
    return knobs.pp


def _megatron_activations(inputs: PlanInputs, knobs: Knobs, shape: ModelShape, tokens: float) -> float:
    """Megatron: CP splits the tokens, TP (and SP) the layer; the busiest pipeline stage holds its L/p layers for
    each micro-batch in flight (min(p, micro-batches), terms.pipeline_inflight_layers); the packed attention's
    [T, T] mask is saved per layer; `full` recompute keeps layer inputs, `selective` drops the attention core. The
    output layer runs over every position."""
    c, tp, sp = inputs.compute_bytes, knobs.tp, knobs.sequence_parallel
    local = tokens / knobs.cp
    kernel = "math" if inputs.attention == "math" else "sdpa_varlen"  # grouped keys and values are expanded
    rank = inputs.lora_rank
    layer = {moe: terms.layer_activation_bytes(shape, c, kernel, moe, tp, sp, tokens, rank == 0,
                                               rank * shape.lora_linears(inputs.lora_targets, moe))
             for moe in (False, True)}
    mask = terms.packed_mask_bytes(local, tokens)
    core = terms.attention_activation_bytes(shape, c, kernel, tp, tokens) - c * shape.heads * shape.head_dim / tp
    moe_share = shape.moe_layers / shape.layers
    mean_layer = local * ((1 - moe_share) * layer[False] + moe_share * layer[True]) + mask
    inflight = terms.pipeline_inflight_layers(shape.layers, knobs.pp, knobs.vp)
    inflight *= min(knobs.pp, micro_batches_per_shard(inputs, knobs)) / knobs.pp
    if knobs.recompute == "full":
        kept = inflight * local * terms.checkpointed_layer_bytes(shape, c, tp, sp) + mean_layer
    elif knobs.recompute == "selective":
        kept = inflight * (mean_layer - local * core - mask) + local * core + mask
    else:
        kept = inflight * mean_layer
    return kept + local * terms.model_activation_bytes(shape, c, 1.0, rank == 0)


def loss_bytes(inputs: PlanInputs, knobs: Knobs, shape: ModelShape, tokens: float, train: bool) -> float:
    """The LM head's output: HF strategies at the scored positions (Ulysses splits the tokens), the logits and in
    training their gradient (terms.logits_bytes); megatron over every position of its CP slice, vocab-parallel over
    TP (terms.vocab_parallel_logits_bytes); or the fused loss's chunk workspaces (terms.fused_loss_bytes)."""
    c = inputs.compute_bytes
    chunk = terms.fused_chunk_tokens(shape.vocab, inputs.fused_chunk)
    if knobs.strategy == "megatron":
        local, vocab = tokens / knobs.cp, shape.vocab / knobs.tp
        if inputs.fused:
            return terms.fused_loss_bytes(vocab, min(chunk, local), shape.hidden)
        return terms.vocab_parallel_logits_bytes(local, vocab, c)
    scored = tokens / max(inputs.ulysses, 1) * inputs.scored_fraction
    if inputs.fused:
        return terms.fused_loss_bytes(shape.vocab, min(chunk, scored))
    return terms.logits_bytes(scored, shape.vocab, c, train)


def forward_bytes(inputs: PlanInputs, knobs: Knobs, shape: ModelShape, state: ModelState, logits: bool) -> float:
    """A forward-only pass on one rank: the gathered units, one layer's activations at a time, and the logits."""
    local = inputs.forward_tokens / (knobs.cp if knobs.strategy == "megatron" else max(inputs.ulysses, 1))
    tp = knobs.tp if knobs.strategy == "megatron" else 1
    layer = terms.layer_activation_bytes(shape, inputs.compute_bytes, inputs.attention, shape.is_moe, tp)
    head = loss_bytes(inputs, knobs, shape, inputs.forward_tokens, train=False) if logits else 0.0
    return state.gathered_forward + local * layer + head


def engine_bytes(inputs: PlanInputs) -> tuple[float, str | None]:
    """The colocated engine's bytes on one GPU while it generates, and why it cannot start (vLLM: its claim must
    hold its bf16 weights and the KV cache of one whole sequence, or vLLM refuses to start)."""
    engine, shape = inputs.engine, inputs.shape
    if engine is None:
        return 0.0, None
    weights = shape.total_params() * 2 / engine.tp  # bf16 weights
    if engine.backend == "vllm" and engine.kv_cache_bytes is not None:
        return weights + engine.kv_cache_bytes, terms.kv_cache_problem(
            engine.kv_cache_bytes, shape, engine.sequence_tokens, 2, engine.tp)
    if engine.backend == "vllm":
        if inputs.gpu_bytes is None:
            return weights, None
        claim = engine.utilization * inputs.gpu_bytes
        kv = terms.vllm_kv_tokens(claim, weights, shape, 2, engine.tp)
        problem = None if kv >= engine.sequence_tokens else (
            f"a vLLM engine's claim ({engine.utilization} x {inputs.gpu_bytes / terms.GIB:.1f} GiB) leaves its KV "
            f"cache {kv:,.0f} tokens after {weights / terms.GIB:.1f} GiB of weights, less than one "
            f"{engine.sequence_tokens}-token sequence: raise generator.gpu_memory_utilization or "
            "generator.inference_engine_tensor_parallel_size, or give the engines GPUs of their own "
            "(trainer.placement.colocate_all=false)")
        return claim, problem
    kv = engine.sequences * engine.sequence_tokens * terms.kv_bytes_per_token(shape, 2)
    return weights + kv, None


def _backward(state: ModelState, saved: float) -> float:
    """A training pass over what stays: its gathered units and gradient buffer, then the larger of what the
    forward saved (at the start of backward) and the gradients with the reduce-scatter's copy (at its end);
    persistent gradients are already in what stays, so the saved activations come on top of them."""
    grads = 0.0 if state.persistent_grads else state.grads
    return state.gathered + state.grad_buffer + max(saved, grads + state.reduce_copy)


def _trained(inputs: PlanInputs, knobs: Knobs, shape: ModelShape, lora: int, role: str) -> tuple[Counts, ModelState]:
    n = counts(shape, lora, inputs.lora_targets)
    return n, model_state(inputs, knobs, shape, n, role)


def estimate(inputs: PlanInputs, layout: Layout, knobs: Knobs, excluded: str | None = None) -> Estimate:
    """The estimate of `layout` (see the module docstring for the phases)."""
    if excluded:
        return Estimate(layout, knobs, excluded=excluded)
    shape = inputs.shape
    _, policy = _trained(inputs, knobs, shape, inputs.lora_rank, "policy")
    ref = critic = None
    if inputs.ref_shape is not None:
        ref = model_state(inputs, knobs, inputs.ref_shape, counts(inputs.ref_shape, 0, (), False), "ref")
    if inputs.critic_shape is not None:
        _, critic = _trained(inputs, knobs, inputs.critic_shape, inputs.critic_lora_rank, "critic")
    stays = {"params": policy.params, "optimizer": policy.optimizer,
             "grads": policy.grads if policy.persistent_grads else 0.0,
             "ref": ref.params if ref else 0.0,
             "critic": (critic.params + critic.optimizer + (critic.grads if critic.persistent_grads else 0.0))
             if critic else 0.0,
             "runtime": inputs.runtime_bytes}
    resident = sum(stays.values())
    activations = activation_bytes(inputs, knobs, shape, inputs.train_tokens)
    logits = loss_bytes(inputs, knobs, shape, inputs.train_tokens, train=True)
    phases = {"train": resident + _backward(policy, activations + logits),
              "optimizer": resident + (0.0 if policy.persistent_grads else policy.grads) + policy.step_copy}
    if critic is not None:
        critic_act = activation_bytes(inputs, knobs, inputs.critic_shape, inputs.train_tokens)
        phases["critic"] = resident + _backward(critic, critic_act)
    passes = [forward_bytes(inputs, knobs, shape, policy, True)]
    if ref is not None:
        passes.append(forward_bytes(inputs, knobs, inputs.ref_shape, ref, True))
    phases["logprobs"] = resident + max(passes)
    engine, engine_problem = engine_bytes(inputs)
    if inputs.engine is not None:
        phases["generate"] = resident + engine
    table = {"params": policy.params, "grads": policy.grads, "optimizer": policy.optimizer,
             "gathered": policy.gathered + policy.grad_buffer, "activations": activations, "logits": logits,
             "ref": stays["ref"], "critic": stays["critic"], "engine": engine, "runtime": inputs.runtime_bytes}
    return Estimate(layout, knobs, table, phases, notes=(engine_problem,) if engine_problem else (),
                    engine_problem=engine_problem)
