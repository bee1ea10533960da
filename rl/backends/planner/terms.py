"""The planner's formulas: bytes per GPU of each thing a training step holds. Small functions, each with its
derivation; no fitted constants (the one allowance, `RUNTIME_BYTES`, says what it stands for).

Notation: P parameters, h hidden size, L layers, a attention heads, k key/value heads, d head dim, f MLP width,
V vocabulary, T tokens of a micro-batch on one rank, c bytes of the compute dtype (2 for bf16, 4 for fp32).

Sources:
- Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (SC 2020), §3.1: mixed
  precision Adam holds 2 + 2 + 12 bytes per parameter (fp16 weights and gradients; fp32 master weights, momentum
  and variance), and ZeRO stages 1/2/3 divide the optimizer state / + gradients / + weights by the data-parallel
  size N.
- megatron-core's docs/source/api-guide/dist_optimizer.md: bytes per parameter with fp32 weights and fp32
  gradients are 4 + 4 + 8/d with the distributed optimizer (d = data-parallel size), 16 without it.
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023), §4: the
  activations of a layer are the tensors its forward saves for backward, counted tensor by tensor; tensor
  parallelism divides the ones inside attention and the MLP by t, sequence parallelism also the layer-norm ones, and
  with 1F1B pipelining the first stage holds p micro-batches of its L/p layers (§4.2.3), with interleaving
  (1 + (p - 1) / (p v)) times that.
- Dao et al., "FlashAttention" (NeurIPS 2022): attention keeps no T x T scores, only q, k, v, the output and the
  row log-sum-exp (flash-attn's `save_for_backward(q, k, v, out, softmax_lse, ...)`).
- Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention" (SOSP 2023) and
  vLLM's `gpu_memory_utilization`: an engine claims that fraction of the device for its weights and KV cache, and
  one token's KV cache is 2 * L * k * d * c bytes (a key and a value vector per layer and key/value head).
"""

from __future__ import annotations

from rl.backends.planner.shape import ModelShape

GIB = 1 << 30
ADAM_BYTES = 8
"""AdamW's two moments, fp32 (torch.optim.AdamW keeps them in the parameter's dtype; every backend here holds fp32
parameters in the optimizer)."""
MASTER_BYTES = 4
"""An fp32 copy of a parameter for the optimizer (ZeRO's master weights)."""
GRAD_FP32 = 4
RUNTIME_BYTES = 1 * GIB
"""Per-GPU allowance for what no formula here counts: the CUDA context, cuBLAS workspaces and NCCL buffers
(typically 0.5-1 GiB on CUDA 12); 0 when the plan is for CPU processes."""
LOGITS_CHUNK_BYTES = 64 << 20
"""`trainer.policy.fused_kernel_chunk_size: null` picks about 64 MiB of fp32 logits per chunk."""


# --- parameters, gradients, optimizer state ---------------------------------------------------------------------
def weight_bytes(params: float, bytes_per_param: int, shards: int = 1) -> float:
    """Weights held on one GPU: P * bytes / shards (ZeRO-3 / FSDP divide by the shard group, TP x PP by the model
    split)."""
    return params * bytes_per_param / max(shards, 1)


def adam_bytes(trainable: float, shards: int = 1) -> float:
    """AdamW's state on one GPU: 8 bytes per trainable parameter (fp32 momentum and variance), divided over the
    ranks that shard it (ZeRO-1 and up, FSDP, megatron's distributed optimizer)."""
    return trainable * ADAM_BYTES / max(shards, 1)


def lora_trainable(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> int:
    """Trainable parameters with LoRA: the adapters only (`ModelShape.lora_params`)."""
    return shape.lora_params(rank, targets)


# --- activations ------------------------------------------------------------------------------------------------
def norm_activation_bytes(shape: ModelShape, c: int, trainable: bool = True) -> float:
    """One RMSNorm of a Hugging Face decoder, per token: it upcasts its input to fp32 and saves it (4h), saves the
    fp32 reciprocal RMS (4), the normalized input cast back to the compute dtype (c h, saved by the weight multiply
    for the weight's gradient, so not when the weight is frozen, as under LoRA), and its output (c h, saved by the
    linear layers that read it): (4 + 2c) h + 4. In fp32 the upcast is the input itself, so 3 tensors of 4h."""
    return (4 + (2 if trainable else 1) * c) * shape.hidden + 4


def attention_activation_bytes(shape: ModelShape, c: int, kernel: str, tp: int = 1, key_tokens: float = 0.0
                               ) -> float:
    """The attention block per token, after the norm: what the kernel saves and the output projection's input.

    `flash` (flash_attention_2): q (a d), k and v (k d each, not repeated), the output (a d, also the o-projection's
    input: a view), and the fp32 log-sum-exp per head: c (2 a d + 2 k d) + 4a.
    `sdpa_varlen` (rl/backends/varlen_attention.py, and megatron's packed attention, which expand grouped keys and
    values to every head): q, k, v copies in sequence order (3 a d), the output (a d), the o-projection's input
    scattered back to packed order (a d), and the log-sum-exp: c (5 a d) + 4a.
    `math` (SDPA's math kernel, what megatron's masked attention runs on CPU): the scaled q and k and v (3 a d), the
    softmax probabilities over `key_tokens` keys (a T_kv), the projection's input (a d): c (4 a d + a T_kv).
    With tensor parallelism each rank holds a/t heads (and k/t key/value heads)."""
    qd, kvd = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    if kernel == "flash":
        saved = c * (2 * qd + 2 * kvd) + 4 * shape.heads
    elif kernel == "math":
        saved = c * (4 * qd + shape.heads * key_tokens)
    else:
        saved = c * 5 * qd + 4 * shape.heads
    return saved / tp


def mlp_activation_bytes(shape: ModelShape, c: int, tp: int = 1) -> float:
    """A gated (SwiGLU) MLP per token: the gate projection's output (SiLU's input), SiLU's output and the up
    projection's output (the product's two factors), and the product (the down projection's input): 4 f c. Its input
    is the norm's output, counted there. Megatron's fused fc1 output ([gate; up], 2f) holds the same bytes."""
    return 4 * shape.intermediate * c / tp


def moe_activation_bytes(shape: ModelShape, c: int, tp: int = 1) -> float:
    """A mixture-of-experts MLP per token: the router's fp32 probabilities (4E), and per routed copy (top-k of
    them) the gathered input (h), the expert's 4 f_e of a gated MLP and its output before the routing weight (h):
    k_top c (2h + 4 f_e); a shared expert adds 4 f_s c. Derived as for the dense MLP (transformers' Mixtral and
    Qwen2-MoE blocks loop over the experts with these tensors); not measured here."""
    routed = shape.experts_per_token * c * (2 * shape.hidden + 4 * shape.expert_intermediate)
    shared = 4 * shape.shared_intermediate * c
    return 4 * shape.experts + (routed + shared) / tp


def layer_activation_bytes(shape: ModelShape, c: int, kernel: str, moe: bool = False, tp: int = 1,
                           sequence_parallel: bool = False, key_tokens: float = 0.0, trainable: bool = True,
                           adapters: int = 0) -> float:
    """Everything one decoder layer saves for backward, per token (Korthikanti et al.'s per-layer count, for an
    RMSNorm / grouped-query attention / SwiGLU decoder without dropout): two norms, attention, the (dense or MoE)
    MLP. Tensor parallelism divides attention and the MLP by t; sequence parallelism the norms too; `trainable`
    false: frozen norm weights (LoRA); `adapters`: LoRA's rank times the adapted linear layers, each saving its
    A x (r values, for B's gradient). Checked exactly against the tensors a tiny Qwen2 saves on CPU, with and
    without LoRA (tests/rl/backends/planner)."""
    norms = 2 * norm_activation_bytes(shape, c, trainable) / (tp if sequence_parallel else 1)
    mlp = moe_activation_bytes(shape, c, tp) if moe else mlp_activation_bytes(shape, c, tp)
    return norms + attention_activation_bytes(shape, c, kernel, tp, key_tokens) + mlp + adapters * c / tp


def model_activation_bytes(shape: ModelShape, c: int, scored_fraction: float = 1.0, trainable: bool = True
                           ) -> float:
    """What the model saves per token outside its layers: the token ids (8), RoPE's cos and sin (2 d c), the final
    norm's fp32 input and normalized output ((4 + c) h + 4: its own output is not saved, only the rows taken from
    it), and at the scored positions the LM head's input (c h) and their index (8). With LoRA (`trainable` false:
    embedding, norms and head frozen) the ids, the final norm's normalized output and the head's input are not
    saved, and neither is the first layer's input to its norm (4h + 4), which needs no gradient: 2 d c + 8 at the
    scored positions."""
    if not trainable:
        return 2 * shape.head_dim * c + 8 * scored_fraction
    return (8 + 2 * shape.head_dim * c + (4 + c) * shape.hidden + 4
            + scored_fraction * (c * shape.hidden + 8))


def checkpointed_layer_bytes(shape: ModelShape, c: int, tp: int = 1, sequence_parallel: bool = False) -> float:
    """With full activation checkpointing a layer keeps only its input (c h per token; with megatron's sequence
    parallelism a 1/t slice); one layer at a time is recomputed in backward (its `layer_activation_bytes`)."""
    return c * shape.hidden / (tp if sequence_parallel else 1)


def pipeline_inflight_layers(layers: int, pp: int, vp: int = 1) -> float:
    """Layers' worth of activations the busiest (first) pipeline stage holds under 1F1B: p micro-batches in flight
    times L/p layers = L, times (1 + (p - 1) / (p v)) with the interleaved schedule (Korthikanti et al. §4.2.3,
    Narayanan et al. 2021); without pipelining, L."""
    if pp <= 1:
        return float(layers)
    return layers * (1 + (pp - 1) / (pp * vp)) if vp > 1 else float(layers)


def packed_mask_bytes(tokens: float, key_tokens: float) -> float:
    """Megatron's packed attention (rl/backends/megatron/attention.py) builds a [T, T] boolean segment-causal mask
    per layer and SDPA saves it for backward: T_q * T_kv bytes per layer."""
    return tokens * key_tokens


# --- logits and the loss ----------------------------------------------------------------------------------------
def logits_bytes(scored_tokens: float, vocab: float, c: int, train: bool) -> float:
    """The logits path (rl/backends/hf_forward.py, rl/kernels/reference/logprobs.py): the LM head's [M, V] logits in
    the compute dtype at the M scored positions, saved by the token-logprob op; in backward their gradient, as large
    (`empty_like(logits)`). A forward-only pass holds the logits alone."""
    return scored_tokens * vocab * c * (2 if train else 1)


def vocab_parallel_logits_bytes(tokens: float, local_vocab: float, c: int) -> float:
    """Megatron's logits path (rl/backends/megatron/logprobs.py): the output layer runs over every position, and
    each TP rank's [T, V/t] logits (c) meet three fp32 copies of the same size in `vocab_parallel_logprobs` (the
    temperature-scaled logits, the max-shifted ones, their exp, saved for backward) at the end of the forward:
    T V/t (c + 12)."""
    return tokens * local_vocab * (c + 12)


def fused_chunk_tokens(vocab: int, chunk: int | None) -> int:
    """Tokens per chunk of the fused loss: `fused_kernel_chunk_size`, or about 64 MiB of fp32 logits."""
    return chunk if chunk else max(1, LOGITS_CHUNK_BYTES // (4 * vocab))


def fused_loss_bytes(vocab: float, chunk_tokens: float, hidden: int = 0) -> float:
    """The fused (chunked) loss (rl/kernels/reference/chunked.py): two reused fp32 [C, V] workspaces (log-softmax
    and softmax of one chunk; C no more than the scored tokens) instead of the whole logits. Megatron's
    vocab-parallel version (rl/backends/megatron/chunked_loss.py) also accumulates the output layer's weight
    gradient in an fp32 [V/t, h] buffer (`hidden` > 0)."""
    return 2 * chunk_tokens * vocab * 4 + vocab * hidden * 4


# --- generation -------------------------------------------------------------------------------------------------
def kv_bytes_per_token(shape: ModelShape, c: int = 2, tp: int = 1) -> float:
    """vLLM's (and transformers') KV cache per token: 2 (key and value) * L * k * d * c, divided over the engine's
    tensor-parallel ranks (each holds k/t heads)."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * c / tp


def kv_cache_problem(kv_bytes: float, shape: ModelShape, sequence_tokens: int, c: int = 2, tp: int = 1) -> str | None:
    """Why a KV cache of `kv_bytes` per engine cannot serve the run (vLLM refuses to start when it cannot hold one
    whole sequence), or None."""
    per_token = kv_bytes_per_token(shape, c, tp)
    if kv_bytes >= sequence_tokens * per_token:
        return None
    return (f"{kv_bytes:,.0f} bytes of KV cache per engine hold {int(kv_bytes // per_token):,} tokens "
            f"({per_token:,.0f} bytes each), less than one {sequence_tokens}-token sequence "
            f"({sequence_tokens * per_token:,.0f} bytes): raise generator.kv_cache_memory_bytes")


def vllm_kv_tokens(claim: float, weights: float, shape: ModelShape, c: int = 2, tp: int = 1) -> float:
    """Tokens of KV cache a vLLM engine gets: what its `gpu_memory_utilization` claim leaves after its weights,
    over `kv_bytes_per_token` (vLLM also subtracts the activations of its profiling run, which this ignores)."""
    return max(claim - weights, 0.0) / kv_bytes_per_token(shape, c, tp)
