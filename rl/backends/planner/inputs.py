"""What the planner reads of a run, independent of the layout: the models' shapes, the GPUs, the tokens of a
micro-batch, precision, LoRA, the fused loss, the reference model, the critic and colocated engines."""

from __future__ import annotations

from dataclasses import dataclass, field

from rl.backends.planner.shape import ModelShape
from rl.backends.planner.terms import GIB, RUNTIME_BYTES

ATTENTION_KERNELS = ("flash", "sdpa_varlen", "math")


@dataclass(frozen=True)
class EngineInputs:
    """Generation engines that share the training GPUs (`trainer.placement.colocate_all=true`)."""

    backend: str
    """`vllm` (engines asleep while the workers train, each claiming `utilization` of its GPU while it generates) or
    `hf` (transformers' generate in the driver, on the first GPU)."""
    utilization: float = 0.8
    kv_cache_bytes: float | None = None
    """vLLM: each engine's KV cache in bytes (`generator.kv_cache_memory_bytes`), else what `utilization` leaves."""
    tp: int = 1
    sequences: int = 1
    """Sequences generated at once (the HF engine: a whole rollout batch)."""
    sequence_tokens: int = 1
    """Prompt + response tokens of the longest sequence (vLLM must hold one in its KV cache)."""


@dataclass(frozen=True)
class PlanInputs:
    shape: ModelShape
    world: int = 1
    """Devices of the policy's training group."""
    gpus_per_node: int = 1
    gpu_bytes: float | None = None
    """Memory of one GPU; None when unknown (nothing is judged to fit or not)."""
    compute_bytes: int = 2
    """2 with bf16 compute (trainer.bf16 true, or null on a GPU), 4 in fp32."""
    train_tokens: int = 4096
    """Tokens of one training micro-batch (max_tokens_per_micro_batch or micro_train_batch_size_per_gpu * (prompt
    + response length))."""
    forward_tokens: int = 4096
    scored_fraction: float = 1.0
    """Share of a micro-batch's tokens that go through the LM head (loss tokens). 1 is the bound the planner uses
    for a config: a micro-batch may be all response tokens."""
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("all-linear",)
    fused: bool = False
    fused_chunk: int | None = None
    attention: str = "sdpa_varlen"
    """How attention runs: `flash` (flash_attention_2), `sdpa_varlen`, or `math` (SDPA's math kernel: megatron's
    masked attention on CPU); see terms.attention_activation_bytes."""
    ulysses: int = 1
    ref_shape: ModelShape | None = None
    """The reference model when it lives on the policy's GPUs (KL terms on, no LoRA, colocated); else None."""
    critic_shape: ModelShape | None = None
    critic_lora_rank: int = 0
    engine: EngineInputs | None = None
    runtime_bytes: float = RUNTIME_BYTES
    mini_batch_sequences: int = 0
    """policy_mini_batch_size * n_samples_per_prompt: each data-parallel shard must get whole micro-batches."""
    micro_batch_sequences: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def gpu_gib(self) -> float | None:
        return None if self.gpu_bytes is None else self.gpu_bytes / GIB


def inputs_from_config(cfg, shape: ModelShape, gpu_bytes: float | None, ref_shape: ModelShape | None = None,
                       critic_shape: ModelShape | None = None, on_gpu: bool = True) -> PlanInputs:
    """PlanInputs of a typed Config. `ref_shape` / `critic_shape`: those models' shapes when they differ from the
    policy's (another path); `on_gpu=False` plans CPU worker processes (fp32 unless trainer.bf16, no CUDA
    runtime allowance)."""
    trainer, gen, placement = cfg.trainer, cfg.generator, cfg.trainer.placement
    length = gen.max_prompt_length + gen.max_generate_length
    bf16 = on_gpu if trainer.bf16 is None else trainer.bf16
    algorithm = trainer.algorithm
    lora = trainer.policy.model.lora
    has_ref = (algorithm.use_kl_loss or algorithm.use_kl_in_reward) and lora.rank == 0
    ref_here = has_ref and (placement.colocate_all or placement.colocate_policy_ref)
    engine = None
    if placement.colocate_all:
        engine = EngineInputs(backend=gen.backend, utilization=gen.gpu_memory_utilization,
                              kv_cache_bytes=gen.kv_cache_memory_bytes,
                              tp=gen.inference_engine_tensor_parallel_size,
                              sequences=trainer.train_batch_size * gen.n_samples_per_prompt, sequence_tokens=length)
    return PlanInputs(
        shape=shape, world=placement.policy_num_nodes * placement.policy_num_gpus_per_node,
        gpus_per_node=placement.policy_num_gpus_per_node, gpu_bytes=gpu_bytes, compute_bytes=2 if bf16 else 4,
        train_tokens=trainer.max_tokens_per_micro_batch or trainer.micro_train_batch_size_per_gpu * length,
        forward_tokens=trainer.max_tokens_per_micro_batch or trainer.micro_forward_batch_size_per_gpu * length,
        lora_rank=lora.rank, lora_targets=tuple(lora.target_modules),
        fused=trainer.policy.use_fused_kernels, fused_chunk=trainer.policy.fused_kernel_chunk_size,
        attention="flash" if trainer.flash_attn else "sdpa_varlen",
        ulysses=trainer.policy.sequence_parallel_size,
        ref_shape=(ref_shape or shape) if ref_here else None,
        # a critic group of its own (colocate_all=false) leaves the policy's devices to the policy
        critic_shape=(critic_shape or shape) if algorithm.advantage_estimator == "gae" and placement.colocate_all
        else None,
        critic_lora_rank=trainer.critic.model.lora.rank,
        engine=engine, runtime_bytes=RUNTIME_BYTES if on_gpu else 0.0,
        mini_batch_sequences=trainer.policy_mini_batch_size * gen.n_samples_per_prompt,
        micro_batch_sequences=trainer.micro_train_batch_size_per_gpu,
    )
