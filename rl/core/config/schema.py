"""The typed config tree. Each field's docstring is its reference documentation.

The dataclasses carry types; every value, defaults included, comes from `defaults.yaml` (a test checks that the two
name the same keys). The training strategies' own blocks (`trainer.policy.fsdp_config`, `deepspeed_config`, ...) are
declared, with their defaults, by the strategies in `rl/backends` (see `rl.core.config.strategies`). Build a
`Config` with `load_config` or `config_from_dict`, which check types and values. The `sft:` and `dpo:` blocks of the
supervised and preference launchers (`rl.launch.sft`, `rl.launch.dpo`) are declared and documented, with their
defaults, in `rl.core.config.supervised`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl.core.config.schema_algorithm import AlgorithmConfig
from rl.core.config.schema_data import DataConfig, EnvironmentConfig, SandboxConfig  # noqa: F401  (importable here)
from rl.core.config.schema_generator import GeneratorConfig
from rl.core.config.schema_models import (  # noqa: F401  (the tree's model blocks, importable from here)
    CriticConfig,
    CriticModelConfig,
    JudgeConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    PolicyConfig,
    RefConfig,
    RefModelConfig,
    RewardConfig,
    RewardModelPathConfig,
)


@dataclass(kw_only=True)
class PlacementConfig:
    """How many nodes and devices each model gets. On CPU one "GPU" is one worker process."""

    colocate_all: bool
    """`true`: the policy, the reference model and the generation engines share devices and take turns (the HF
    engine in the driver, vLLM engines sleeping while the workers train). `false`: the engines get devices of their
    own (`generator.num_inference_engines` x `inference_engine_tensor_parallel_size` bundles, one CPU core each on
    a CPU machine), so generation can overlap training (`trainer.fully_async`), and the reference model may get
    workers of its own (`colocate_policy_ref=false`)."""

    policy_num_nodes: int
    """Nodes of the policy's training group."""

    policy_num_gpus_per_node: int
    """Devices per node of the policy's training group. The world size of every parallelism rule is
    policy_num_nodes * policy_num_gpus_per_node."""

    colocate_policy_ref: bool
    """With colocate_all=false: `true` runs the reference model on the policy's workers; `false` gives it a worker
    group of its own (`ref_num_nodes` x `ref_num_gpus_per_node` devices), whose logprob pass runs beside the
    policy's."""

    ref_num_nodes: int | None
    """Nodes of the reference model's group; null follows the policy (required unless colocate_policy_ref=false)."""

    ref_num_gpus_per_node: int | None
    """Devices per node of the reference model's group; null follows the policy."""

    critic_num_nodes: int | None
    """Nodes of the critic (SkyRL's key); null follows the policy. With `colocate_all=true` the critic runs on the
    policy's workers, so a value must equal `policy_num_nodes`; with `colocate_all=false` it is the size of the
    critic's own worker group (as SkyRL places it)."""

    critic_num_gpus_per_node: int | None
    """Devices per node of the critic; null follows the policy. With `colocate_all=true` a value must equal
    `policy_num_gpus_per_node`; with `colocate_all=false` the critic gets this many devices of its own per node (a
    multiple of its model-parallel size)."""

    gpu_memory_gb: float | None
    """Memory of one GPU in GiB, for the memory planner (`bazel run //rl/launch:plan`, preflight's check,
    `trainer.strategy=auto`); null reads it from this machine's first GPU (and, with none, leaves memory unjudged)."""

    allow_predicted_oom: bool
    """`true` runs a layout the planner predicts will not fit the GPUs; `false` (the default) refuses it before
    anything starts, with the predicted numbers and a layout that fits."""


@dataclass(kw_only=True)
class FullyAsyncConfig:
    """Asynchronous training (SkyRL's `trainer.fully_async`; NeMo RL's `grpo.async_grpo` maps here): the engines,
    on devices of their own (`trainer.placement.colocate_all=false`), keep generating the next batches while the
    workers train, with the weights of the newest policy pushed to them after every step. Each engine call's
    rollouts carry the policy version that produced them; a batch is trained on only while its rollouts are at most
    `max_staleness_steps` policy updates old. The off-policy correction (`trainer.algorithm.off_policy_correction`)
    applies to their logprobs."""

    enabled: bool
    """Overlap generation and training."""

    max_staleness_steps: int
    """How many policy updates a trained-on rollout may lag behind: 0 is the synchronous schedule (same results),
    1 is veRL's one-step off-policy, larger values let the engines run further ahead."""

    partial_rollout_tokens: int
    """0: an engine takes new weights between whole calls (a push waits for the call in progress). N > 0: partial
    rollouts: engines generate N tokens per segment and a push lands at the next segment boundary; open responses
    go on from their sampled tokens under the new weights, every token keeps the policy version that sampled it
    (its logprobs are its own behaviour policy's for the off-policy correction) and the staleness bound holds for
    the oldest token. Needs `enabled`."""


@dataclass(kw_only=True)
class TrainerConfig:
    """The training loop, its batch sizes, and the policy, reference and placement blocks."""

    strategy: str
    """Training backend: `fsdp`, `fsdp2`, `deepspeed` or `megatron`, or `auto`: the memory planner picks the strategy
    and its layout (the decision guide, then the cheapest layout predicted to fit; see `rl.backends.planner.auto`). The
    `--strategy` flag overrides it."""

    auto_choice: str | None
    """A record, not a setting: what `trainer.strategy=auto` chose and the rule that chose it, written by the
    loader so the run's config.yaml keeps it; null when the strategy was named."""

    kernels: str
    """Kernel implementation: `auto` (fastest available on the device), `torch`, `triton` or `cuda`."""

    exact_on_policy: bool
    """The generation engine and the policy's training forward compute each token's logprob with the same
    batch-invariant arithmetic (`rl.core.batch_invariant`), so the logprobs the engine samples with are the trainer's
    to the bit, whatever the batch, padding, packing, micro-batching or data-parallel split. The old-logprob pass is
    then skipped (the engine's logprobs are the old ones), the first mini-batch's importance ratio is exactly 1, and
    `exact_logprob_gap` (the first mini-batch's token-mean |trainer - engine| logprob) is logged, 0.0 when it holds.
    CPU only, the HF engine, fp32, the whole distribution (no top-k/top-p) and the fsdp, fsdp2 and deepspeed
    strategies; other combinations are refused with the reason. Its cost: bench/README.md ("Exact on-policy")."""

    use_sample_packing: bool
    """Pack sequences into flat micro-batches (no padding); `false` pads each micro-batch instead."""

    max_tokens_per_micro_batch: int | None
    """Token budget of one packed micro-batch; null means micro_train_batch_size_per_gpu *
    (generator.max_prompt_length + generator.max_generate_length). Packing only."""

    train_batch_size: int
    """Prompts per training step (one rollout batch). Must be a multiple of policy_mini_batch_size."""

    policy_mini_batch_size: int
    """Prompts per optimizer step. policy_mini_batch_size * n_samples_per_prompt sequences must split evenly into
    micro-batches over data-parallel ranks: a multiple of micro_train_batch_size_per_gpu * data-parallel size."""

    micro_train_batch_size_per_gpu: int
    """Sequences per forward/backward pass on one device (gradients are accumulated over micro-batches)."""

    micro_forward_batch_size_per_gpu: int
    """Sequences per forward-only pass (old and reference log-probabilities) on one device."""

    epochs: int
    """Passes over the training data."""

    max_steps: int | None
    """Stop after this many training steps; `null` runs all `epochs`."""

    gradient_checkpointing: bool
    """Recompute activations in backward to save memory. With `megatron` it means full (whole-layer) recompute
    unless `trainer.policy.megatron_config.recompute_granularity` is set, which then decides."""

    bf16: bool | None
    """Mixed precision (SkyRL's key): `true` computes the forward and backward in bfloat16 while the weights the
    optimizer updates, the gradient reduction and the logprobs and loss stay float32 (fsdp2: MixedPrecisionPolicy,
    fsdp: MixedPrecision, deepspeed: its `bf16` block, megatron: bf16 autocast), on any device, CPU included;
    `false` trains in float32. null (the default): `true` on a GPU, `false` on CPU. SkyRL's default is `true`; a
    deepspeed_config that sets `bf16` itself keeps it. Applies to the policy and the reference model."""

    flash_attn: bool | None
    """Attention kernel of the fsdp, fsdp2 and deepspeed models (SkyRL's key): `true` uses flash-attention's varlen
    kernel (`flash_attention_2`) and is refused where the `flash-attn` package is not installed or the device is not
    a GPU; `false` uses PyTorch SDPA one packed sequence at a time (`sdpa_varlen`); null (the default) uses
    flash-attention on a GPU where it is installed and SDPA elsewhere, printing the fallback on a GPU. SkyRL's
    default is `true`. megatron has its own attention (SDPA over packed sequences) and refuses `true`."""

    seed: int
    """Seed of every random generator (data order, sampling, initialization), >= 0."""

    policy: PolicyConfig
    """The trained model."""

    ref: RefConfig
    """The reference model."""

    critic: CriticConfig
    """The value model (advantage_estimator `gae`)."""

    critic_mini_batch_size: int | None
    """Prompts per critic optimizer step (SkyRL's key); null follows policy_mini_batch_size. Must divide
    train_batch_size."""

    update_epochs_per_batch: int
    """Passes over each rollout batch (PPO epochs, SkyRL's key), for the policy and the critic; each pass runs
    every mini-batch again, with the old logprobs and values of before the first pass. >= 1."""

    critic_warmup: int
    """Steps at the start of a run in which only the critic trains (veRL's `trainer.critic_warmup`): the policy is
    not updated until the critic has learned some values. 0 trains both from step 1."""

    reward: RewardConfig
    """Reward models."""

    placement: PlacementConfig
    """Nodes and devices."""

    actor_call_timeout_s: float | None
    """Seconds any one call to the training workers or the generation engines (a generation, a logprob pass, a
    mini-batch update, a weight push) may take before the run ends, naming the actors that did not answer and the
    last complete checkpoint; null waits forever. Raise it for long generations on large models."""

    max_restarts: int
    """How many recoveries from a lost actor (one that died, or stopped answering within actor_call_timeout_s) the
    run makes of each kind, generation engines and the others, within trainer.restart_window_steps; 0 ends the run at
    the first loss, naming the actor. An engine lost during a generation call (or while a weight push waits for its
    calls) is replaced on its own, brought to the weights the engines hold, and its calls are issued again with
    their seeds (with partial rollouts, the segment in progress); any other loss (a training worker, critic,
    reference or reward model, or an engine lost while weights stream to it) starts all the run's actors again from
    the last complete checkpoint (from the start without one), and the steps since it run again
    (trainer.ckpt_interval bounds how many). Both give the weights an uninterrupted run would have, synchronous or
    asynchronous. An exception raised inside a live actor is not retried."""

    restart_window_steps: int
    """The window of trainer.max_restarts, in steps: a recovery counts against the limit while it is one of the last
    restart_window_steps steps; 0 counts every recovery of the run."""

    collective_timeout_s: float | None
    """Seconds a collective of the training workers (an all-reduce, all-gather or broadcast in any of their
    process groups: torch's, FSDP's, DeepSpeed's, Megatron-Core's) may wait for the other ranks before it fails;
    null keeps torch's defaults (10 minutes with nccl, 30 with gloo). When null, the launcher reads SkyRL's
    SKYRL_WORKER_NCCL_TIMEOUT_IN_S or NCCL_TIMEOUT (seconds) from the environment, and says so."""

    fully_async: FullyAsyncConfig
    """Generation overlapping training."""

    algorithm: AlgorithmConfig
    """Advantages and loss."""

    ckpt_interval: int
    """Save a resumable checkpoint every this many steps; 0 never saves."""

    max_ckpts_to_keep: int
    """SkyRL's key: -1 keeps every checkpoint; N >= 1 keeps N of them, the newest N, or with `ckpt_keep_metric` the
    N best (NeMo RL's `keep_top_k`), and always the newest (what `resume_mode=latest` takes). The others are
    removed after each checkpoint is committed."""

    ckpt_keep_metric: str | None
    """The metrics.jsonl key (e.g. `val_accuracy`, `reward_mean`) that ranks checkpoints for `max_ckpts_to_keep`,
    read at each checkpoint's step; a checkpoint whose step did not log it ranks last. Null ranks by recency."""

    ckpt_keep_higher_is_better: bool
    """Whether a higher `ckpt_keep_metric` is better."""

    hf_save_interval: int
    """Export Hugging Face weights every this many steps; 0 never exports."""

    eval_interval: int
    """Evaluate on data.val_data every this many steps; 0 never evaluates during training."""

    eval_before_train: bool
    """Evaluate once before the first training step."""

    non_finite: str
    """A non-finite reward (from an environment), loss or gradient norm is never applied: `fail` (the default) ends
    the run naming where it came from (the environment and row, or the step); `skip` skips that step's update on
    every rank (the gradients are dropped, `skipped_steps` counts it in the metrics) and goes on. Checkpoints are
    committed only when every rank's weights are finite."""

    resume_mode: str
    """`none` starts fresh, `latest` resumes the newest complete checkpoint in ckpt_path (fresh if none), any other
    value is the path of a checkpoint directory to resume, which must exist."""

    ckpt_path: str | None
    """Directory of resumable checkpoints; null means `checkpoints/` in the run directory. `~` is expanded."""

    export_path: str | None
    """Directory of exported Hugging Face weights; null means `exports/` in the run directory. `~` is expanded."""

    logger: list[str]
    """Metric sinks: any of `console`, `tensorboard`, `wandb`. A single name is accepted for a one-item list."""

    project_name: str
    """Project name for the loggers."""

    run_name: str | None
    """Run name for the loggers; `null` derives one from the time."""


@dataclass(kw_only=True)
class Config:
    """The whole run's configuration."""

    trainer: TrainerConfig
    """Training loop, backend and algorithm."""

    generator: GeneratorConfig
    """Rollout generation."""

    data: DataConfig
    """Datasets and reward."""

    environment: EnvironmentConfig
    """Multi-turn environments."""

    blocks: dict[str, Any] = field(default_factory=dict, metadata={"strategy_blocks": True})
    """The strategies' own config blocks, by dotted key (`trainer.policy.megatron_config`), typed by the strategy
    that declares them (`rl.core.config.strategies`); in YAML and overrides they sit at those keys. Filled by the
    loader, not a key of its own."""
