"""SkyRL's config keys (its 2025 YAML spellings and its 2026 typed config, `skyrl/train/config/config.py`) that are
not ours, and what each does here.

Most of SkyRL's keys are ours already (this project took SkyRL's names): `trainer.strategy`, the batch sizes, the
placement, `trainer.algorithm.*`, `trainer.policy.optimizer_config.{lr, weight_decay, max_grad_norm}`, ... This
table holds the rest. Values that SkyRL spells differently on keys we share (an interval of -1, `resume_mode=null`,
`environment.env_class=gsm8k`) are handled by the rules in `skyrl_rules.py`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from rl.core.config.dialects.entries import (
    EMPTY,
    FALSE,
    NONE,
    Alias,
    ByRule,
    Entry,
    Inert,
    Refused,
    Removed,
    feature_off,
    ignored,
    off,
    only,
    speed_only,
)

T, G, IE = "trainer.", "generator.", "generator.inference_engine."
_LANGUAGE_MODEL_ONLY = feature_off(
    "loading only the language model of a vision-language checkpoint (its vision tower dropped)",
    "remove it: a vision-language model trains whole here (trainer.policy.model.freeze_vision_tower=true keeps its "
    "vision tower fixed)",
)
SP, ESP = "generator.sampling_params.", "generator.eval_sampling_params."
MEGATRON = "trainer.policy.megatron_config"
REF_LAYOUT = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)


def _disabled_interval(value):
    """SkyRL's -1 (and 0) "never" is our 0."""
    return 0 if value is not None and value <= 0 else value


def _budget(value):
    """SkyRL's max_tokens_per_microbatch -1 (micro-batches by sequence count) is our null (budget from the micro
    batch size and the lengths)."""
    return None if value is None or value <= 0 else value


def _gb_to_mib(value):
    return max(1, round(float(value) * 1024))


_NO_PROFILER = "`trainer.policy.torch_profiler_config.enable=false` (profile the workers with your own tools)"
_PACKING = "micro-batches are packed here (trainer.use_sample_packing)"


def _optimizer(model: str) -> dict[str, Entry]:
    block = f"{T}{model}.optimizer_config."
    return {
        block + "adam_betas": Alias(block + "betas"),
        block + "num_warmup_steps": Alias(
            block + "lr_warmup_steps",
            differs="the warm-up is linear from lr / steps at the first optimizer step to lr at step `steps` (SkyRL's "
            "constant_with_warmup starts at 0 and reaches lr one step later)",
        ),
        block + "offload_after_step": speed_only("optimizer state offload between steps"),
    }


def _fsdp(model: str) -> dict[str, Entry]:
    block = f"{T}{model}.fsdp_config."
    return {
        block + "mixed_precision": only(
            (None,),
            "no mixed-precision block: trainer.bf16 decides",
            "a mixed-precision policy of its own",
            "set trainer.bf16 instead",
        ),
        block + "mixed_precision.param_dtype": only(
            ("bf16", "bfloat16"),
            "bf16 compute with fp32 reduction is what trainer.bf16=true does",
            "other mixed-precision dtypes",
            "set trainer.bf16 (true: bf16 compute, fp32 weights and reduction)",
        ),
        block + "mixed_precision.reduce_dtype": only(
            ("fp32", "float32"),
            "gradients are reduced in fp32 here",
            "gradient reduction in low precision",
            "remove it",
        ),
        block + "mixed_precision.buffer_dtype": only(
            ("fp32", "float32"), "buffers stay fp32 here", "low-precision buffers", "remove it"
        ),
        block + "wrap_policy": only(
            ({}, None), "one FSDP unit per decoder layer, as here", "a custom FSDP wrap policy", "remove it"
        ),
        block + "wrap_policy.*": Refused("a custom FSDP wrap policy", "remove it: each decoder layer is one unit"),
    }


def _lora(model: str) -> dict[str, Entry]:
    block = f"{T}{model}.model.lora."
    return {
        block + "lora_sync_path": ignored("adapters reach the engines in memory here, not through a directory"),
        block + "max_loras": only(
            (1,), "one adapter per engine", "serving several LoRA adapters at once", "set it to 1"
        ),
        block + "max_cpu_loras": feature_off("vLLM's CPU LoRA cache", "remove it"),
    }


def _reference_model() -> dict[str, Entry]:
    """Keys of the reference model that follow the policy here."""
    return {
        f"{T}ref.model.lora.rank": only(
            (0,),
            "the reference model has no adapters",
            "LoRA on the reference model",
            "set trainer.policy.model.lora for the policy",
        ),
        f"{T}ref.model.lora.*": ignored("the reference model has no adapters"),
        f"{T}ref.model.fake_int4_qat.*": feature_off(
            "fake-INT4 quantization-aware training", "remove it", (False, None, 32, True, 7.5, -8.0)
        ),
        f"{T}ref.model_config_kwargs": feature_off("Hugging Face config overrides", "remove it", ({}, None)),
        f"{T}ref.language_model_only": _LANGUAGE_MODEL_ONLY,
    }


def _model_extras(model: str) -> dict[str, Entry]:
    return {
        f"{T}{model}.model.fake_int4_qat.enabled": feature_off("fake-INT4 quantization-aware training", "remove it"),
        f"{T}{model}.model_config_kwargs": feature_off(
            "Hugging Face config overrides (model_config_kwargs)", "remove it", ({}, None)
        ),
    }


def _megatron_extras(block: str) -> dict[str, Entry]:
    """SkyRL's megatron_config keys that are not in our block."""
    return {
        f"{block}.empty_cuda_cache": speed_only("emptying the CUDA cache before the optimizer step"),
        f"{block}.expert_tensor_parallel_size": ByRule(
            "accepted when it equals the tensor-parallel size (ETP = TP here) or no experts are split"
        ),
        f"{block}.moe_token_dispatcher_type": speed_only("MoE token dispatch"),
        f"{block}.moe_grouped_gemm": speed_only("MoE grouped GEMM"),
        f"{block}.moe_per_layer_logging": ignored("per-layer MoE metrics are not logged here"),
        f"{block}.moe_router_load_balancing_type": only(
            ("none",),
            "no auxiliary load-balancing loss, as here",
            "an auxiliary MoE load-balancing loss",
            f"set {MEGATRON}.transformer_config_kwargs.moe_router_load_balancing_type",
        ),
        f"{block}.moe_aux_loss_coeff": only(
            (0,),
            "no auxiliary load-balancing loss, as here",
            "an auxiliary MoE load-balancing loss",
            f"set {MEGATRON}.transformer_config_kwargs.moe_aux_loss_coeff",
        ),
        f"{block}.moe_router_score_function": only(
            (None,),
            "Megatron-Core's router, as configured by the model",
            "another MoE router score function",
            f"set {MEGATRON}.transformer_config_kwargs.moe_router_score_function",
        ),
        f"{block}.moe_router_enable_expert_bias": only(
            (None, False),
            "no expert bias, as here",
            "an expert bias",
            f"set {MEGATRON}.transformer_config_kwargs.moe_router_enable_expert_bias",
        ),
        f"{block}.moe_enable_routing_replay": feature_off("rollout routing replay (R3)", "remove it"),
        f"{block}.moe_router_dtype": only(
            ("fp32", None),
            "the router computes in fp32 here",
            "another router precision",
            f"set {MEGATRON}.transformer_config_kwargs.moe_router_dtype",
        ),
        f"{block}.freeze_moe_router": feature_off("frozen MoE routers", "remove it (routers train here)"),
        f"{block}.ddp_config.grad_reduce_in_fp32": only(
            (True,), "gradients are reduced in fp32 here", "gradient reduction in bf16", "remove it"
        ),
        f"{block}.ddp_config.overlap_grad_reduce": speed_only("overlapping the gradient reduction"),
        f"{block}.ddp_config.overlap_param_gather": speed_only("overlapping the parameter gather"),
        f"{block}.ddp_config.average_in_collective": speed_only("averaging inside the collective"),
        f"{block}.hf_export_config.distributed_save": speed_only("writing exports from several ranks"),
        f"{block}.hf_export_config.save_every_n_ranks": speed_only("writing exports from several ranks"),
        f"{block}.lora_config.lora_type": only(("lora",), "plain LoRA, as here", "canonical LoRA", "set it to lora"),
        f"{block}.lora_config.merge_lora": only(
            (True,), "the engines get merged weights here", "unmerged adapters on the engines", "set it to true"
        ),
        f"{block}.optimizer_config_kwargs": only(
            ({}, None),
            "Megatron-Core's optimizer defaults",
            "pass-through optimizer arguments",
            "give them one key at a time",
        ),
        f"{block}.optimizer_config_kwargs.optimizer_cpu_offload": Alias(f"{MEGATRON}.optimizer_cpu_offload"),
        f"{block}.optimizer_config_kwargs.overlap_cpu_optimizer_d2h_h2d": speed_only("overlapping the host copies"),
        f"{block}.optimizer_config_kwargs.use_precision_aware_optimizer": feature_off(
            "Megatron-Core's precision-aware optimizer", "remove it"
        ),
        f"{block}.optimizer_config_kwargs.optimizer_offload_fraction": only(
            (0.0, 1.0),
            "all or nothing, as optimizer_cpu_offload does here",
            "a partial optimizer offload",
            f"use {MEGATRON}.optimizer_cpu_offload",
        ),
        f"{block}.optimizer_config_kwargs.*": Refused(
            "pass-through arguments of Megatron-Core's OptimizerConfig", "remove them"
        ),
        f"{block}.model_config_kwargs": feature_off("Hugging Face config overrides", "remove it", ({}, None)),
        f"{block}.dist_ckpt_optim_fully_reshardable": speed_only("the optimizer checkpoint layout"),
        f"{block}.mtp_num_layers": only(
            (None, 0), "no multi-token prediction heads are trained", "multi-token prediction heads", "remove it"
        ),
        f"{block}.mtp_loss_weight": ignored("used only with multi-token prediction heads"),
        f"{block}.mtp_loss_chunk_size": ignored("used only with multi-token prediction heads"),
        f"{block}.mtp_loss_topk": ignored("used only with multi-token prediction heads"),
        f"{block}.async_dist_ckpt_save": speed_only("writing checkpoints in the background"),
        f"{block}.async_dist_ckpt_strategy": speed_only("writing checkpoints in the background"),
        f"{block}.async_save_prestage_to_cpu": speed_only("writing checkpoints in the background"),
    }


def _ref_megatron() -> dict[str, Entry]:
    """`trainer.ref.megatron_config.*`: the reference model uses the policy's Megatron-Core layout here (skyrl_rules
    checks the sizes equal the policy's)."""
    block = f"{T}ref.megatron_config"
    found: dict[str, Entry] = {f"{block}.*": ignored("the reference model uses the policy's Megatron-Core layout here")}
    for name in REF_LAYOUT:
        found[f"{block}.{name}"] = ByRule(
            f"accepted when it equals {MEGATRON}.{name} (the reference model uses the policy's layout here)"
        )
    return found


def _eval_sampling() -> dict[str, Entry]:
    """SkyRL's evaluation sampling block: evaluation here samples at generator.eval_temperature with the training
    length and stop strings and no top-p / top-k cut."""
    return {
        f"{ESP}temperature": Alias(f"{G}eval_temperature"),
        f"{ESP}max_generate_length": ByRule("generator.max_generate_length (evaluation uses the training length)"),
        f"{ESP}stop": ByRule("generator.stop (evaluation uses the training stop strings)"),
        f"{ESP}top_p": only((1.0,), "no top-p cut in evaluation, as here", "top-p sampling in evaluation", "remove it"),
        f"{ESP}top_k": only(
            (-1, None), "no top-k cut in evaluation, as here", "top-k sampling in evaluation", "remove it"
        ),
        f"{ESP}repetition_penalty": only((1.0,), "no repetition penalty, as here", "a repetition penalty", "remove it"),
        f"{ESP}min_p": only((0.0,), "no min-p sampling, as here", "min-p sampling", "remove it"),
        f"{ESP}logprobs": only((None, 0, 1), "the sampled token's logprob, as here", "top-k logprobs", "set it to 1"),
        f"{ESP}additional_kwargs": feature_off("extra sampling arguments", "remove them", (None, {})),
    }


@functools.cache
def table() -> Mapping[str, Entry]:
    found: dict[str, Entry] = {
        # --- data ---------------------------------------------------------------------------------------------
        "data.dataloader.num_workers": speed_only("prompt loading workers"),
        "data.dataloader.persistent_workers": speed_only("prompt loading workers"),
        # --- trainer: renamed keys ----------------------------------------------------------------------------
        f"{T}max_prompt_length": Alias(
            f"{G}max_prompt_length",
            differs=("a longer prompt is cut to this length here as data.truncation says (left: its last tokens kept); "
                     "SkyRL leaves such prompts out of the dataset"),
        ),
        f"{T}max_training_steps": Alias(f"{T}max_steps"),
        f"{T}max_tokens_per_microbatch": Alias(f"{T}max_tokens_per_micro_batch", convert=_budget),
        f"{T}remove_microbatch_padding": Alias(f"{T}use_sample_packing"),
        f"{T}policy.gradient_checkpointing": Alias(f"{T}gradient_checkpointing"),
        # --- trainer: speed, memory, logging ------------------------------------------------------------------
        f"{T}use_expandable_segments": speed_only("the CUDA allocator's expandable segments"),
        f"{T}sequence_parallel_backend": only(
            ("ulysses",),
            "Ulysses is the sequence parallelism here",
            "another sequence-parallel backend",
            "set it to ulysses",
        ),
        f"{T}gradient_checkpointing_use_reentrant": speed_only("reentrant activation checkpointing"),
        f"{T}log_path": ignored("infrastructure logs go to the run directory here"),
        f"{T}eval_batch_size": speed_only("evaluation batching"),
        f"{T}recompute_old_logprobs_per_minibatch": ignored(
            "old logprobs are computed once per batch here, the same values up to float summation order"
        ),
        f"{T}update_ref_every_epoch": feature_off("re-syncing the reference model each epoch", "remove it"),
        f"{T}disable_fast_tokenizer": feature_off("the slow tokenizer", "remove it"),
        f"{T}enable_ray_gpu_monitor": ignored("GPU metrics of Ray are not collected here"),
        f"{T}tags": feature_off("W&B run tags", "remove them"),
        f"{T}dump_data_batch": feature_off("dumping training batches to files", "remove it"),
        f"{T}dump_eval_results": Inert(
            "evaluation is logged as metrics (val_accuracy, val_pass@k) here; per-sample dumps are not written"
        ),
        f"{T}print_example_interval": ignored("examples are not printed to the console here"),
        f"{T}log_example_interval": ignored("examples are not printed to the console here"),
        f"{T}num_logger_eval_samples": feature_off("W&B tables of samples", "remove it", (-1, 0)),
        f"{T}num_logger_train_samples": feature_off("W&B tables of samples", "remove it", (-1, 0)),
        f"{T}logprobs_chunk_size": speed_only("chunked logprob computation"),
        f"{T}vocab_entropy_chunk_size": speed_only("chunked entropy computation"),
        f"{T}vocab_entropy_chunk_memory_mb": speed_only("chunked entropy computation"),
        f"{T}fused_lm_head_logprob": feature_off(
            "Megatron-Core's fused LM-head logprobs",
            "use trainer.policy.use_fused_kernels, with a strategy that has it",
        ),
        f"{T}fused_lm_head_logprob_backend": ignored("used only with fused_lm_head_logprob"),
        f"{T}resume_path": ByRule("with resume_mode=from_path: trainer.resume_mode=<the path>"),
        f"{T}rope_scaling": feature_off("RoPE scaling overrides", "remove it"),
        f"{T}rope_theta": feature_off("RoPE overrides", "remove it"),
        f"{T}mtp.enabled": feature_off("multi-token prediction heads", "remove it"),
        f"{T}mtp.*": ignored("used only with multi-token prediction heads"),
        # --- trainer.policy -----------------------------------------------------------------------------------
        f"{T}policy.use_torch_compile": feature_off("torch.compile of the logits", "remove it"),
        f"{T}policy.record_memory": feature_off("memory snapshots", "remove it"),
        f"{T}policy.torch_profiler_config.enable": feature_off("the torch profiler", _NO_PROFILER),
        f"{T}policy.language_model_only": _LANGUAGE_MODEL_ONLY,
        f"{T}policy.inference_only_init": feature_off("inference-only workers", "remove it"),
        # --- trainer.critic -----------------------------------------------------------------------------------
        f"{T}critic.model.lora.lora_sync_path": ignored("the critic's adapters never leave the workers"),
        f"{T}critic.model.lora.max_loras": ignored("the critic is not served by engines"),
        f"{T}critic.model.lora.max_cpu_loras": ignored("the critic is not served by engines"),
        # --- trainer.algorithm --------------------------------------------------------------------------------
        f"{T}algorithm.temperature": ByRule(
            "null, or generator.temperature (logprobs are taken at the sampling temperature here)"
        ),
        f"{T}algorithm.advantage_batch_normalize": feature_off("batch-level advantage normalization", "remove it"),
        f"{T}algorithm.value_head_prefix": ignored("the value head's name inside the critic"),
        f"{T}algorithm.tis_imp_ratio_cap": ByRule(
            "trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high (with use_tis)"
        ),
        f"{T}algorithm.use_tis": ByRule("trainer.algorithm.off_policy_correction.tis_ratio_type=token"),
        f"{T}algorithm.cispo.cispo_eps_clip_high": ByRule("trainer.algorithm.eps_clip_high (policy_loss_type=cispo)"),
        f"{T}algorithm.cispo.cispo_eps_clip_low": ByRule("1.0: no lower bound on the CISPO weight, as here"),
        f"{T}algorithm.cispo.cispo_anchor": ByRule("old: the ratio to the old policy, as here"),
        f"{T}algorithm.dppo.*": ignored("used only with policy_loss_type=dppo"),
        f"{T}algorithm.max_seq_len": ByRule("null, or generator.max_generate_length (the Dr. GRPO normalizer here)"),
        # --- trainer.fully_async ------------------------------------------------------------------------------
        f"{T}fully_async.num_parallel_generation_workers": speed_only("concurrent generation requests"),
        f"{T}fully_async.sample_full_batch": ByRule("trainer.algorithm.dynamic_sampling.type=filter"),
        f"{T}fully_async.clear_kv_cache_on_weight_sync": speed_only("the engines' KV cache"),
        f"{T}fully_async.simulate_training": feature_off("a simulated trainer", "remove it"),
        f"{T}fully_async.simulate_training_step_seconds": ignored("used only with simulate_training"),
        f"{T}fully_async.simulate_weight_sync_seconds": ignored("used only with simulate_training"),
        # --- generator (2026: inference_engine.*, sampling_params.*) ------------------------------------------
        f"{IE}num_engines": Alias(f"{G}num_inference_engines"),
        f"{IE}backend": Alias(f"{G}backend"),
        f"{IE}tensor_parallel_size": Alias(f"{G}inference_engine_tensor_parallel_size"),
        f"{IE}gpu_memory_utilization": Alias(f"{G}gpu_memory_utilization"),
        f"{IE}enable_prefix_caching": Alias(f"{G}enable_prefix_caching"),
        f"{IE}max_num_batched_tokens": Alias(f"{G}max_num_batched_tokens"),
        f"{IE}max_num_seqs": Alias(f"{G}max_num_seqs"),
        f"{IE}weight_sync_backend": ByRule(
            "generator.weight_sync_backend; SkyRL's nccl with colocated engines (CUDA IPC there) is our null"
        ),
        f"{IE}weight_transfer_threshold_cuda_ipc_GB": Alias(f"{G}weight_sync_bucket_mb", convert=_gb_to_mib),
        f"{IE}engine_init_kwargs": ByRule("generator.engine_init_kwargs"),
        f"{IE}run_engines_locally": only(
            (True,), "engines are started by the run, as here", "external inference servers", "set it to true"
        ),
        f"{IE}model_dtype": ignored("the engines hold the policy's weights in the dtype vLLM picks for the model"),
        f"{IE}pipeline_parallel_size": only(
            (1,), "no pipeline parallelism in the engines, as here", "pipeline-parallel engines", "set it to 1"
        ),
        f"{IE}expert_parallel_size": only(
            (1,), "no expert parallelism in the engines, as here", "expert-parallel engines", "set it to 1"
        ),
        f"{IE}data_parallel_size": only(
            (1,), "one replica per engine, as here", "data-parallel engines", "use generator.num_inference_engines"
        ),
        f"{IE}vllm_v1_disable_multiproc": speed_only("vLLM's multiprocessing"),
        f"{IE}enable_chunked_prefill": speed_only("vLLM's chunked prefill"),
        f"{IE}enable_return_routed_experts": feature_off("rollout routing replay (R3)", "remove it"),
        f"{IE}enforce_eager": speed_only("CUDA graphs in the engines"),
        f"{IE}fully_sharded_loras": speed_only("vLLM's LoRA sharding"),
        f"{IE}enable_ray_prometheus_stats": ignored("engine metrics are not exported to Prometheus here"),
        f"{IE}offload_kv_for_weight_sync": speed_only("the engines' KV cache during weight sync"),
        f"{IE}use_expandable_segments": speed_only("the engines' CUDA allocator"),
        f"{IE}distributed_executor_backend": speed_only("vLLM's executor"),
        f"{IE}served_model_name": Alias("generator.served_model_name"),
        f"{IE}async_engine": Removed("in July 2026: its engines are always asynchronous"),
        f"{IE}language_model_only": _LANGUAGE_MODEL_ONLY,
        f"{IE}speculative_config": feature_off("speculative decoding", "remove it"),
        f"{IE}external_proxy_url": feature_off("external inference servers", "remove it"),
        f"{IE}external_server_urls": feature_off("external inference servers", "remove it"),
        f"{IE}enable_pd": feature_off("prefill-decode disaggregation", "remove it"),
        f"{IE}num_prefill": feature_off("prefill-decode disaggregation", "remove it", (0,)),
        f"{IE}router_init_kwargs": feature_off("a vLLM router", "remove it", ({}, None)),
        f"{IE}delta_weight_sync": feature_off("checkpoint-delta weight sync", "remove it"),
        f"{IE}delta_weight_sync.*": ignored("used only with weight_sync_backend=delta"),
        f"{SP}max_generate_length": Alias(f"{G}max_generate_length"),
        f"{SP}temperature": Alias(f"{G}temperature"),
        f"{SP}top_p": Alias(f"{G}top_p"),
        f"{SP}top_k": Alias(f"{G}top_k"),
        f"{SP}stop": Alias(f"{G}stop"),
        f"{SP}repetition_penalty": only((1.0,), "no repetition penalty, as here", "a repetition penalty", "remove it"),
        f"{SP}min_p": only((0.0,), "no min-p sampling, as here", "min-p sampling", "remove it"),
        f"{SP}logprobs": only((None, 0, 1), "the sampled token's logprob, as here", "top-k logprobs", "set it to 1"),
        f"{SP}additional_kwargs": feature_off("extra sampling arguments", "remove them", (None, {})),
        f"{SP}additional_kwargs.*": Refused("extra sampling arguments", "remove them"),
        f"{G}eval_sampling_params": ByRule("null: evaluation at generator.eval_temperature"),
        # --- generator (2025 flat spellings and the rest) -----------------------------------------------------
        f"{G}run_engines_locally": only(
            (True,), "engines are started by the run, as here", "external inference servers", "set it to true"
        ),
        f"{G}async_engine": speed_only("vLLM's async engine"),
        f"{G}batched": speed_only("batched generation"),
        f"{G}model_name": ByRule("trainer.policy.model.path (the engines serve the policy)"),
        f"{G}model_dtype": ignored("the engines hold the policy's weights in the dtype vLLM picks for the model"),
        f"{G}weight_transfer_threshold_cuda_ipc_GB": Alias(f"{G}weight_sync_bucket_mb", convert=_gb_to_mib),
        f"{G}inference_engine_pipeline_parallel_size": only(
            (1,), "no pipeline parallelism in the engines", "pipeline-parallel engines", "set it to 1"
        ),
        f"{G}inference_engine_expert_parallel_size": only(
            (1,), "no expert parallelism in the engines", "expert-parallel engines", "set it to 1"
        ),
        f"{G}inference_engine_data_parallel_size": only(
            (1,), "one replica per engine", "data-parallel engines", "use generator.num_inference_engines"
        ),
        f"{G}vllm_v1_disable_multiproc": speed_only("vLLM's multiprocessing"),
        f"{G}enable_chunked_prefill": speed_only("vLLM's chunked prefill"),
        f"{G}enforce_eager": speed_only("CUDA graphs in the engines"),
        f"{G}fully_sharded_loras": speed_only("vLLM's LoRA sharding"),
        f"{G}enable_ray_prometheus_stats": ignored("engine metrics are not exported to Prometheus here"),
        f"{G}remote_inference_engine_urls": ignored("used only with run_engines_locally=false"),
        f"{G}external_proxy_url": feature_off("external inference servers", "remove it"),
        f"{G}external_server_urls": feature_off("external inference servers", "remove it"),
        f"{G}override_existing_update_group": ignored("weight-sync groups are made once per run here"),
        f"{G}rope_scaling": feature_off("RoPE scaling overrides", "remove it"),
        f"{G}rope_theta": feature_off("RoPE overrides", "remove it"),
        f"{G}chat_template.source": only(
            ("name",), "the model's own chat template, as here", "a chat template from a file", "remove it"
        ),
        f"{G}chat_template.name_or_path": feature_off("a custom chat template", "remove it"),
        f"{G}chat_template_kwargs": feature_off("chat template arguments", "remove them", ({}, None)),
        f"{G}chat_template_kwargs.*": Refused("chat template arguments", "remove them"),
        f"{G}use_conversation_multi_turn": ignored("used only by SkyRL's generator for multi-turn environments"),
        f"{G}append_eos_token_after_stop_str_in_multi_turn": ignored("used only by SkyRL's multi-turn generator"),
        f"{G}zero_reward_on_non_stop": feature_off(
            "zero rewards for truncated responses",
            "use generator.apply_overlong_filtering, or a reward function that reads the finish reason",
        ),
        f"{G}use_cache_salt": speed_only("vLLM's prefix cache salt"),
        f"{G}step_wise_trajectories": feature_off("step-wise trajectories", "remove it"),
        f"{G}merge_stepwise_output": feature_off("step-wise trajectories", "remove it"),
        f"{G}vision_language_generator": ignored(
            "generation follows the model here: a vision-language checkpoint samples with each prompt's images"
        ),
        # --- environment --------------------------------------------------------------------------------------
        "environment.skyrl_gym.max_env_workers": Alias("environment.max_env_workers"),
        "environment.skyrl_gym.*": ignored("options of SkyRL-gym environments that are not built in here"),
    }
    for model in ("policy", "critic"):
        found.update(_optimizer(model))
        found.update(_fsdp(model))
        found.update(_model_extras(model))
    found.update(_fsdp("ref"))
    found.update(_lora("policy"))
    found.update(_reference_model())
    found.update(_megatron_extras(MEGATRON))
    found.update(_ref_megatron())
    found[f"{T}policy.torch_profiler_config.*"] = ignored("used only with the torch profiler")
    found[f"{T}ref.sequence_parallel_size"] = ByRule(
        "trainer.policy.sequence_parallel_size (the reference model shares the policy's groups)"
    )
    found[f"{T}critic.model.fake_int4_qat.*"] = ignored("fake-INT4 training applies to the policy only")
    found[f"{T}policy.model.fake_int4_qat.*"] = ignored("used only with fake_int4_qat.enabled")
    found.update(_eval_sampling())
    return found


SWITCHES: Mapping[str, str] = {
    f"{T}policy.torch_profiler_config": f"{T}policy.torch_profiler_config.enable",
    f"{T}policy.model.fake_int4_qat": f"{T}policy.model.fake_int4_qat.enabled",
    f"{T}mtp": f"{T}mtp.enabled",
}

_ = (EMPTY, FALSE, NONE, off)  # re-exported for the rules
