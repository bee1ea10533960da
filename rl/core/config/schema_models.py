"""The model blocks of the config tree: the policy (its model, LoRA adapters and optimizer), the reference, the
critic, and the reward models and LLM judge. Each field's docstring is its reference documentation; values come from
`defaults.yaml` like the rest of `rl.core.config.schema`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class LoraConfig:
    """LoRA adapters (SkyRL's keys): only the adapters train; the reference model is the base with them off (no
    second copy), the optimizer state is the adapters', and exports are a PEFT adapter folder."""

    rank: int
    """Rank of each adapter; 0 turns LoRA off."""

    alpha: float
    """Scale numerator: an adapter adds (alpha / rank) * B A x. > 0."""

    dropout: float
    """Dropout on an adapter's input while training, in [0, 1)."""

    target_modules: list[str]
    """Names of the linear layers that get adapters (`q_proj`, `v_proj`, ...), or [all-linear] (every linear layer
    but the LM head). A name the model does not have is refused."""

    exclude_modules: list[str] | None
    """Names left out of target_modules' matches; null leaves none out."""

    init_method: str
    """How A starts (B starts at zero, so training starts from the base model): `kaiming` (PEFT's default) or
    `gaussian`."""

    merge_on_export: bool
    """Exports (trainer.hf_save_interval) also write the merged full weights (`merged/` beside the adapter)."""


@dataclass(kw_only=True)
class ModelConfig:
    """Where a model's weights come from."""

    path: str
    """Hugging Face model id or local directory of the policy (and reference) model. `~` is expanded. `embedded`
    builds the embedded default job's small model (tokenizer, config and a short supervised warm-up, all local)."""

    lora: LoraConfig
    """LoRA adapters on the policy. On a vision-language model they go on the language layers only (the vision
    tower stays frozen, as the base weights do)."""

    freeze_vision_tower: bool
    """A vision-language policy (Qwen2-VL's family) trains its language model only: the vision encoder and merger
    keep their weights (no gradients, no optimizer state). Refused for a text model."""


@dataclass(kw_only=True)
class OptimizerConfig:
    """AdamW settings of the policy."""

    lr: float
    """Peak learning rate, >= 0 (0 runs the whole loop without changing the weights)."""

    weight_decay: float
    """Decoupled weight decay, >= 0."""

    max_grad_norm: float
    """Clip the global gradient norm to this value; 0 turns clipping off."""

    betas: list[float]
    """AdamW's (beta1, beta2), each in [0, 1)."""

    lr_warmup_steps: int
    """Optimizer steps of linear warm-up from 0 to `lr`; 0 starts at `lr`."""

    scheduler: str
    """The rate after the warm-up (SkyRL's key): `constant` at `lr`; `cosine` or `linear` decay from `lr` to
    `min_lr` over lr_decay_steps (transformers' schedules of those names, Megatron-Core's decay styles)."""

    min_lr: float
    """Where a decay ends (Megatron-Core's and NeMo RL's key), in [0, lr]."""

    lr_decay_steps: int | None
    """The optimizer step at which a decay reaches min_lr, warm-up included (NeMo RL's `lr_decay_iters`); null: the
    run's last (every training step's mini-batches times update_epochs_per_batch, as SkyRL counts them)."""


@dataclass(kw_only=True)
class PolicyConfig:
    """The trained model and the settings of every backend for it."""

    model: ModelConfig
    """The policy's weights."""

    optimizer_config: OptimizerConfig
    """Optimizer and learning-rate schedule."""

    sequence_parallel_size: int
    """Ulysses sequence-parallel size (SkyRL's key): each packed micro-batch split over this many ranks (fsdp and
    fsdp2), data-parallel size world / sequence_parallel_size; the reference model uses the same groups. With
    `megatron` use `megatron_config.sequence_parallel`."""

    use_fused_kernels: bool
    """veRL's `use_fused_kernels`: the policy loss (and the policy's and reference's logprob passes) go from the
    last hidden states and the LM-head weight straight to the loss, a chunk of tokens at a time, through
    `trainer.kernels` (the fused Triton/CUDA loss kernel on GPU, torch on CPU), so the [tokens, vocabulary] logits
    never exist: same loss and gradients, far less peak memory at large vocabularies. Every strategy; the policy
    losses with a kernel formula only (`regular`, `dual_clip`, `cispo`: checks_values.FUSED_KERNEL_POLICY_LOSSES)."""

    fused_kernel_chunk_size: int | None
    """Tokens per chunk of `use_fused_kernels`; null picks about 64 MiB of fp32 logits per chunk."""


@dataclass(kw_only=True)
class RefModelConfig:
    """Where the reference model's weights come from."""

    path: str | None
    """null: the policy's starting weights (`trainer.policy.model.path`). Any other model with the policy's
    tokenizer (refused at load otherwise) makes the KL terms pull towards it: a teacher for on-policy distillation
    (SkyRL's recipe: `advantage_estimator=no_op`, `policy_loss_type=importance_sampling`, `use_kl_in_reward=true`).
    `embedded_teacher` builds the embedded task's teacher: the embedded model warmed up four times as long on careful
    demonstrations, which carries where the embedded student forgets to."""


@dataclass(kw_only=True)
class RefConfig:
    """The frozen reference model used for the KL terms. Its strategy settings are in the strategies' blocks
    (`trainer.ref.fsdp_config`)."""

    model: RefModelConfig
    """The reference's weights."""


@dataclass(kw_only=True)
class CriticModelConfig:
    """Where the critic's weights come from."""

    path: str | None
    """null: the policy's `trainer.policy.model.path` with a new value head (one output per token, drawn from a
    fixed seed); or a critic exported by an earlier run (a one-label `...ForTokenClassification` checkpoint, the
    `critic/` folder of an export), whose value head it keeps. Must share the policy's tokenizer."""

    lora: LoraConfig
    """LoRA adapters on the critic (`rank` 0: none): its backbone frozen, the adapters and the value head trained;
    checkpoints hold those, exports the merged token classifier."""


@dataclass(kw_only=True)
class CriticConfig:
    """The value model of `trainer.algorithm.advantage_estimator=gae` (SkyRL's `trainer.critic` block): the
    backbone of a causal LM with a one-output value head, trained by the run's strategy on the policy's workers
    (`trainer.placement.colocate_all=true`) or on a group of its own (`colocate_all=false`). Its strategy
    settings are `trainer.critic.fsdp_config` (fsdp, fsdp2); deepspeed and megatron train it with the policy's
    blocks (`deepspeed_config.train`, `trainer.policy.megatron_config`)."""

    model: CriticModelConfig
    """The critic's weights."""

    optimizer_config: OptimizerConfig
    """The critic's AdamW and learning-rate schedule (SkyRL's default learning rate is 5e-6)."""

    sequence_parallel_size: int
    """Ulysses sequence-parallel size of the critic. On the policy's workers it shares their data-parallel layout,
    so it must equal `trainer.policy.sequence_parallel_size`; a critic group of its own (`colocate_all=false`) takes
    its own."""


@dataclass(kw_only=True)
class RewardModelPathConfig:
    """Where the reward model's weights are."""

    path: str | None
    """A Hugging Face sequence-classification model with one label (e.g. a `...ForSequenceClassification`
    directory); its logit for prompt + response is the reward named `reward_model` in data.reward_fn. null: none."""


@dataclass(kw_only=True)
class JudgeConfig:
    """An LLM judge: a causal LM asked, through a generation engine, to grade each response; the reward named
    `llm_judge` in data.reward_fn."""

    model_path: str | None
    """The judge model (a local directory or a cached hub name); null: no judge."""

    backend: str
    """Its generation engine: `hf` or `vllm`."""

    template: str | None
    """The request, with `{prompt}`, `{response}` and `{answer}` filled in per row (`{response}` is required; write
    `{{` `}}` for literal braces); sent as one user turn when the judge's tokenizer has a chat template."""

    pattern: str | None
    """A regular expression with one group: the judge's score is that group of its last match, as a number. An
    answer without a match is a failed reward call (see data.reward_on_error)."""

    max_new_tokens: int
    """Most tokens of the judge's answer (greedy decoding), >= 1."""


@dataclass(kw_only=True)
class RewardConfig:
    """Models that score responses (SkyRL's `trainer.reward`): each runs in a Ray actor of its own, on a GPU share
    when there is one, and is listed in data.reward_fn by name to count (weighted by data.reward_weights)."""

    model: RewardModelPathConfig
    """The sequence-classification reward model (`reward_model`)."""

    batch_size: int
    """Responses the reward model scores in one forward pass, >= 1."""

    judge: JudgeConfig
    """The LLM judge (`llm_judge`)."""
