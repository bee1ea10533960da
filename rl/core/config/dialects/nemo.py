"""NeMo RL's config keys (its GRPO recipes, `examples/configs/grpo_math_1B.yaml` and the files that inherit it, and
the keys seed 003 documents) and what each does here.

The training strategies declare the NeMo RL keys of their own blocks (`StrategyConfig.nemo_flags` / `nemo_keys`:
`policy.megatron_cfg.enabled`, `policy.megatron_cfg.tensor_model_parallel_size`, `policy.dtensor_cfg.cpu_offload`,
...); this table holds the rest. Keys whose meaning depends on other keys (lengths, batch sizes, the advantage
estimator, the KL term, LoRA, the optimizer of the selected backend, ...) are translated by `nemo_rules.py`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from rl.core.config import strategies
from rl.core.config.dialects.entries import (
    Alias,
    ByRule,
    Elsewhere,
    Entry,
    Inert,
    Refused,
    feature_off,
    ignored,
    only,
    speed_only,
)

P, GEN, MC = "policy.", "policy.generation.", "policy.megatron_cfg."
VLLM, MCORE_GEN = GEN + "vllm_cfg.", GEN + "mcore_generation_config."
DTENSOR = ("policy.dtensor_cfg.", "policy.dtensor_config.")
_O, _A = "trainer.policy.optimizer_config.", "trainer.algorithm."
DATA_KEYS = (
    "max_input_seq_length",
    "shuffle",
    "num_workers",
    "use_multiple_dataloader",
    "train",
    "train.*",
    "validation",
    "validation.*",
    "default.*",
    "dataset_name",
    "prompt_file",
    "system_prompt_file",
    "data_path",
    "input_key",
    "output_key",
    "split_validation_size",
    "seed",
)
"""NeMo RL's `data.*` keys (the rest of `data.*` is ours)."""
_SFT = "this launcher trains GRPO and PPO; supervised fine-tuning has its own: bazel run //rl/launch:sft"
_DPO = "this launcher trains GRPO and PPO; preference training has its own: bazel run //rl/launch:dpo"


def _top_k(value):
    """NeMo RL's null top_k (no cut) is our -1."""
    return -1 if value is None else value


def _dtensor(prefix: str) -> dict[str, Entry]:
    """Keys of NeMo RL's DTensor backend block that the strategy it selects does not declare."""
    return {
        prefix + "_v2": ignored(
            "the DTensor implementation version: the strategy policy.dtensor_cfg.enabled selects here"
        ),
        prefix + "sequence_parallel": feature_off(
            "DTensor sequence parallelism over a TP group",
            "use trainer.policy.sequence_parallel_size (Ulysses) or trainer.policy.megatron_config.sequence_parallel",
        ),
        prefix + "tensor_parallel_size": only(
            (1,),
            "no tensor parallelism in the DTensor strategy, as here",
            "tensor parallelism with DTensor",
            "use trainer.policy.megatron_config.tensor_model_parallel_size (Megatron-Core)",
        ),
        prefix + "context_parallel_size": only(
            (1,),
            "no context parallelism in the DTensor strategy, as here",
            "DTensor context parallelism",
            "use trainer.policy.sequence_parallel_size (Ulysses) or "
            "trainer.policy.megatron_config.context_parallel_size",
        ),
        prefix + "custom_parallel_plan": feature_off("a custom parallel plan", "remove it"),
        prefix + "automodel_kwargs": feature_off("Automodel arguments", "remove them", ({}, None)),
        prefix + "automodel_kwargs.*": Refused("Automodel arguments", "remove them"),
        prefix + "clear_cache_every_n_steps": speed_only("emptying the CUDA cache"),
        prefix + "lora_cfg.*": ByRule("trainer.policy.model.lora (enabled: rank = dim)"),
    }


def _megatron() -> dict[str, Entry]:
    """Keys of NeMo RL's megatron block that the megatron strategy does not declare."""
    return {
        MC + "model_overrides": feature_off("Megatron-Bridge model overrides", "remove them", ({}, None)),
        MC + "checkpoint.*": speed_only("checkpoint writing"),
        MC + "use_fused_linear_logprobs": feature_off(
            "fused logprobs with Megatron-Core", "use trainer.policy.use_fused_kernels, with a strategy that has it"
        ),
        MC + "fused_linear_logprobs_chunk_size": ignored("used only with use_fused_linear_logprobs"),
        MC + "force_reconvert_from_hf": ignored("the Hugging Face weights are converted at every start here"),
        MC + "empty_unused_memory_level": speed_only("emptying the CUDA cache"),
        MC + "activation_checkpointing": ByRule("trainer.gradient_checkpointing (with recompute_granularity)"),
        MC + "recompute_granularity": ByRule(
            "trainer.policy.megatron_config.recompute_granularity, with activation_checkpointing"
        ),
        MC + "recompute_modules": ByRule("trainer.policy.megatron_config.transformer_config_kwargs.recompute_modules"),
        MC + "cuda_graph_impl": only(("none",), "no CUDA graphs in training", "CUDA graphs in training", "remove it"),
        MC + "cuda_graph_modules": ignored("used only with CUDA graphs"),
        MC + "cuda_graph_warmup_steps": ignored("used only with CUDA graphs"),
        MC + "fine_grained_activation_offloading": feature_off("activation offloading", "remove it"),
        MC + "offload_modules": ignored("used only with fine_grained_activation_offloading"),
        MC + "expert_tensor_parallel_size": ByRule(
            "accepted when it equals the tensor-parallel size (ETP = TP here) or no experts are split"
        ),
        MC + "num_layers_in_first_pipeline_stage": feature_off("uneven pipeline stages", "remove it"),
        MC + "num_layers_in_last_pipeline_stage": feature_off("uneven pipeline stages", "remove it"),
        MC + "pipeline_dtype": ignored("pipeline messages follow the training precision (policy.precision)"),
        MC + "freeze_moe_router": ByRule("true is accepted for dense models (routers of MoE models train here)"),
        MC + "moe_router_dtype": ByRule("MoE knob: accepted for dense models"),
        MC + "moe_router_load_balancing_type": ByRule("MoE knob: accepted for dense models"),
        MC + "moe_router_bias_update_rate": ByRule("MoE knob: accepted for dense models"),
        MC + "moe_permute_fusion": speed_only("a fused MoE permutation kernel"),
        MC + "moe_enable_deepep": speed_only("DeepEP's MoE dispatch"),
        MC + "moe_token_dispatcher_type": speed_only("MoE token dispatch"),
        MC + "moe_shared_expert_overlap": speed_only("overlapping shared experts"),
        MC + "moe_per_layer_logging": ignored("per-layer MoE metrics are not logged here"),
        MC + "apply_rope_fusion": speed_only("a fused RoPE kernel"),
        MC + "bias_activation_fusion": speed_only("a fused bias-activation kernel"),
        MC + "gradient_accumulation_fusion": speed_only("fused gradient accumulation"),
        MC + "use_fused_weighted_squared_relu": speed_only("a fused activation kernel"),
        MC + "defer_fp32_logits": feature_off("logits kept in bf16 until the loss", "remove it"),
        MC + "use_gloo_process_groups": speed_only("extra gloo groups"),
        MC + "mtp_num_layers": only(
            (0, None), "no multi-token prediction heads are trained", "multi-token prediction heads", "remove it"
        ),
        MC + "mtp_*": ignored("used only with multi-token prediction heads"),
        MC + "peft.*": ByRule("trainer.policy.model.lora (enabled: rank = dim)"),
        MC + "optimizer.*": ByRule("trainer.policy.optimizer_config (with the Megatron backend)"),
        MC + "scheduler.*": ByRule("trainer.policy.optimizer_config.lr_warmup_steps (with the Megatron backend)"),
        MC + "distributed_data_parallel_config.grad_reduce_in_fp32": ByRule("gradients are reduced in fp32 here"),
        MC + "distributed_data_parallel_config.overlap_grad_reduce": speed_only("overlapping the gradient reduction"),
        MC + "distributed_data_parallel_config.overlap_param_gather": speed_only("overlapping the parameter gather"),
        MC + "distributed_data_parallel_config.use_custom_fsdp": only(
            (False,), "Megatron-Core's own data parallelism", "Megatron-Core's FSDP", "remove it"
        ),
        MC + "distributed_data_parallel_config.data_parallel_sharding_strategy": speed_only("optimizer sharding"),
        MC + "fp8_cfg.enabled": feature_off("FP8 training", "remove it"),
        MC + "env_vars": feature_off(
            "environment variables for the Megatron workers", "set them in the shell", (None, {})
        ),
    }


def _generation() -> dict[str, Entry]:
    return {
        GEN + "backend": Alias("generator.backend"),
        GEN + "temperature": Alias("generator.temperature"),
        GEN + "top_p": Alias("generator.top_p"),
        GEN + "top_k": Alias("generator.top_k", convert=_top_k),
        GEN + "max_new_tokens": ByRule("generator.max_generate_length (bounded with max_total_sequence_length)"),
        GEN + "val_temperature": Alias("generator.eval_temperature"),
        GEN + "val_top_p": ByRule("generator.top_p (evaluation uses the training top-p here)"),
        GEN + "val_top_k": ByRule("generator.top_k (evaluation uses the training top-k here)"),
        GEN + "stop_strings": Alias("generator.stop"),
        GEN + "stop_token_ids": feature_off("stop token ids", "use generator.stop (strings)", (None, [])),
        GEN + "port_range_low": ignored("engine ports are picked by Ray here"),
        GEN + "port_range_high": ignored("engine ports are picked by Ray here"),
        GEN + "refit_transport": only(
            (None,),
            "the transport is picked by the placement, as here",
            "a named refit transport",
            "set generator.weight_sync_backend",
        ),
        GEN + "real_quant_export_cpu_offload": speed_only("quantized weight export"),
        GEN + "refit_cfg.*": ignored("used only with the nixl refit transport"),
        MCORE_GEN + "*": ignored("used only with NeMo RL's Megatron generation backend"),
        GEN + "vllm_kwargs": ByRule("generator.engine_init_kwargs"),
        GEN + "colocated.enabled": Alias("trainer.placement.colocate_all"),
        GEN + "colocated.resources.*": ByRule("generator.num_inference_engines (engines on devices of their own)"),
        VLLM + "async_engine": speed_only("vLLM's async engine"),
        VLLM + "precision": ignored("the engines hold the policy's weights in the dtype vLLM picks for the model"),
        VLLM + "kv_cache_dtype": only(
            ("auto",), "the model's dtype for the KV cache", "a quantized KV cache", "remove it"
        ),
        VLLM + "logprobs_mode": only(
            ("processed_logprobs",),
            "logprobs after temperature and top-p/k, as here",
            "raw logprobs from the engines",
            "remove it",
        ),
        VLLM + "tensor_parallel_size": Alias("generator.inference_engine_tensor_parallel_size"),
        VLLM + "pipeline_parallel_size": only(
            (1,), "no pipeline parallelism in the engines", "pipeline-parallel engines", "set it to 1"
        ),
        VLLM + "expert_parallel_size": only(
            (1,), "no expert parallelism in the engines", "expert-parallel engines", "set it to 1"
        ),
        VLLM + "gpu_memory_utilization": Alias("generator.gpu_memory_utilization"),
        VLLM + "max_model_len": ByRule("the bound of prompt + response (with max_total_sequence_length)"),
        VLLM + "enforce_eager": speed_only("CUDA graphs in the engines"),
        VLLM + "use_tqdm": ignored("progress bars"),
        VLLM + "use_deep_gemm": speed_only("DeepGEMM kernels"),
        VLLM + "num_last_layers_in_bf16": only(
            (0,), "no mixed-precision layers in the engines", "bf16 layers in quantized engines", "remove it"
        ),
        VLLM + "num_first_layers_in_bf16": only(
            (0,), "no mixed-precision layers in the engines", "bf16 layers in quantized engines", "remove it"
        ),
        VLLM + "enable_vllm_metrics_logger": ignored("engine metrics are not logged here"),
        VLLM + "vllm_metrics_logger_interval": ignored("engine metrics are not logged here"),
        VLLM + "http_refit_api_key_env_var": ignored("used only with HTTP refit"),
        VLLM + "http_refit_server_port": ignored("used only with HTTP refit"),
        VLLM + "zmq_refit_server_port": ignored("used only with ZeroMQ refit"),
        VLLM + "reset_encoder_cache_after_weight_update": ignored("used only with multimodal encoders"),
    }


def _grpo() -> dict[str, Entry]:
    return {
        "grpo.num_generations_per_prompt": Alias("generator.n_samples_per_prompt"),
        "grpo.num_prompts_per_step": Alias("trainer.train_batch_size"),
        "grpo.max_num_steps": Alias("trainer.max_steps"),
        "grpo.max_num_epochs": Alias("trainer.epochs"),
        "grpo.max_rollout_turns": Alias("generator.max_turns"),
        "grpo.val_period": Alias("trainer.eval_interval"),
        "grpo.val_at_start": Alias("trainer.eval_before_train"),
        "grpo.val_at_end": Inert("with an evaluation interval the last step is evaluated here"),
        "grpo.val_start_at": only(
            (-1, 0, None), "evaluation from the first interval, as here", "a delayed start of evaluation", "remove it"
        ),
        "grpo.val_num_generations_per_prompt": Alias("generator.eval_n_samples_per_prompt"),
        "grpo.max_val_samples": Inert("every prompt of data.val_data is evaluated here"),
        "grpo.val_batch_size": speed_only("evaluation batching"),
        "grpo.seed": Alias("trainer.seed"),
        "grpo.overlong_filtering": Alias("generator.apply_overlong_filtering"),
        "grpo.normalize_rewards": ByRule("trainer.algorithm.grpo_norm_by_std (with the baseline)"),
        "grpo.use_leave_one_out_baseline": ByRule("trainer.algorithm.advantage_estimator (rloo without std)"),
        "grpo.adv_estimator.*": ByRule("trainer.algorithm.advantage_estimator"),
        "grpo.advantage_clip_low": feature_off("advantage clipping", "remove it"),
        "grpo.advantage_clip_high": feature_off("advantage clipping", "remove it"),
        "grpo.stop_at_validation_metric": feature_off("early stopping on a validation metric", "remove it"),
        "grpo.stop_at_validation_threshold": ignored("used only with stop_at_validation_metric"),
        "grpo.use_dynamic_sampling": ByRule("trainer.algorithm.dynamic_sampling.type=filter"),
        "grpo.dynamic_sampling_max_gen_batches": Alias(_A + "dynamic_sampling.max_sample_batches"),
        "grpo.batch_multiplier": only(
            (1,),
            "one prompt batch generated at a time, as here",
            "larger generation batches for dynamic sampling",
            "set it to 1",
        ),
        "grpo.reward_shaping.*": ByRule("trainer.algorithm.overlong_buffer (DAPO's overlong penalty)"),
        "grpo.reward_scaling.enabled": ByRule("accepted with the identity mapping"),
        "grpo.reward_scaling.*": ByRule("accepted with the identity mapping"),
        "grpo.seq_logprob_error_threshold": feature_off("dropping sequences by logprob error", "remove it"),
        "grpo.invalid_tool_call_advantage": feature_off(
            "a fixed advantage for turns with an invalid tool call",
            "remove it; the agent's or environment's reward can score such an episode",
        ),
        "grpo.malformed_thinking_advantage": feature_off("advantages for malformed thinking tags", "remove it"),
        "grpo.async_grpo.enabled": Alias("trainer.fully_async.enabled"),
        "grpo.async_grpo.max_trajectory_age_steps": Alias("trainer.fully_async.max_staleness_steps"),
        "grpo.async_grpo.max_generation_failures": only(
            (0,), "a failed generation ends the run, as here", "tolerated generation failures", "set it to 0"
        ),
        "grpo.async_grpo.in_flight_weight_updates": feature_off("in-flight weight updates", "remove it"),
        "grpo.async_grpo.recompute_kv_cache_after_weight_updates": feature_off(
            "KV-cache recomputation after weight updates", "remove it"
        ),
    }


def _loss() -> dict[str, Entry]:
    kl_clamps = "the k3 estimator clamps the log ratio to +-20 and the result to +-10 here"
    return {
        "loss_fn.reference_policy_kl_penalty": ByRule(
            "trainer.algorithm.kl_loss_coef (use_kl_loss, or use_kl_in_reward)"
        ),
        "loss_fn.use_kl_in_reward": ByRule("trainer.algorithm.use_kl_in_reward"),
        "loss_fn.reference_policy_kl_type": Alias(_A + "kl_estimator_type"),
        "loss_fn.kl_input_clamp_value": only((20, None), kl_clamps, "another KL input clamp", "set it to 20"),
        "loss_fn.kl_output_clamp_value": only((10, None), kl_clamps, "another KL output clamp", "set it to 10"),
        "loss_fn.ratio_clip_min": Alias(_A + "eps_clip_low"),
        "loss_fn.ratio_clip_max": Alias(_A + "eps_clip_high"),
        "loss_fn.ratio_clip_c": ByRule("trainer.algorithm.policy_loss_type=dual_clip with clip_ratio_c"),
        "loss_fn.use_on_policy_kl_approximation": feature_off("the importance-weighted KL approximation", "remove it"),
        "loss_fn.use_importance_sampling_correction": ByRule("trainer.algorithm.off_policy_correction"),
        "loss_fn.truncated_importance_sampling_type": ByRule("trainer.algorithm.off_policy_correction"),
        "loss_fn.truncated_importance_sampling_ratio": ByRule("trainer.algorithm.off_policy_correction"),
        "loss_fn.truncated_importance_sampling_ratio_min": ByRule("trainer.algorithm.off_policy_correction"),
        "loss_fn.sequence_level_importance_ratios": ByRule("trainer.algorithm.policy_loss_type=gspo"),
        "loss_fn.token_level_loss": ByRule("trainer.algorithm.loss_reduction"),
        "loss_fn.force_on_policy_ratio": feature_off(
            "a ratio forced to 1", "remove it: with one optimizer step per batch the ratio is 1"
        ),
        "loss_fn.use_cispo": ByRule("trainer.algorithm.policy_loss_type=cispo"),
        "loss_fn.disable_ppo_ratio": ByRule("trainer.algorithm.policy_loss_type=importance_sampling"),
        "loss_fn.positive_example_nll_weight": only(
            (0, 0.0), "no NLL term, as here", "VAPO's positive-example NLL loss", "remove it"
        ),
    }


def _policy() -> dict[str, Entry]:
    return {
        P + "model_name": Alias("trainer.policy.model.path"),
        P + "tokenizer.name": ByRule("trainer.policy.model.path (the policy's own tokenizer)"),
        P + "tokenizer.chat_template_kwargs": feature_off("chat template arguments", "remove them", (None, {})),
        P + "tokenizer.chat_template": feature_off("a custom chat template", "remove it", (None, "default")),
        P + "tokenizer.use_fastokens": speed_only("a faster tokenizer"),
        P + "hf_config_overrides": feature_off("Hugging Face config overrides", "remove them", ({}, None)),
        P + "train_global_batch_size": ByRule("trainer.policy_mini_batch_size (sequences / samples per prompt)"),
        P + "train_micro_batch_size": Alias("trainer.micro_train_batch_size_per_gpu"),
        P + "logprob_batch_size": Alias("trainer.micro_forward_batch_size_per_gpu"),
        P + "generation_batch_size": speed_only("hf generation batching"),
        P + "max_total_sequence_length": ByRule("generator.max_prompt_length + generator.max_generate_length"),
        P + "max_seq_length": ByRule("generator.max_prompt_length + generator.max_generate_length"),
        P + "precision": ByRule("trainer.bf16 (bfloat16: true, float32: false)"),
        P + "logprob_chunk_size": speed_only("chunked logprob computation"),
        P + "offload_optimizer_for_logprob": speed_only("optimizer offload"),
        P + "max_grad_norm": Alias(_O + "max_grad_norm"),
        P + "make_sequence_length_divisible_by": ignored("sequences are padded for tensor parallelism as needed"),
        P + "optimizer": ByRule("trainer.policy.optimizer_config (AdamW)"),
        P + "optimizer.*": ByRule("trainer.policy.optimizer_config (AdamW)"),
        P + "scheduler": ByRule("trainer.policy.optimizer_config.lr_warmup_steps"),
        P + "draft.enabled": feature_off("a speculative-decoding draft model", "remove it"),
        P + "dynamic_batching.*": ByRule("trainer.max_tokens_per_micro_batch (packed micro-batches)"),
        P + "sequence_packing.*": ByRule("trainer.use_sample_packing with trainer.max_tokens_per_micro_batch"),
    }


def _run() -> dict[str, Entry]:
    """Checkpointing, logging, the cluster, the data and the math environment."""
    return {
        "checkpointing.enabled": ByRule("false: trainer.ckpt_interval=0"),
        "checkpointing.checkpoint_dir": Alias("trainer.ckpt_path"),
        "checkpointing.save_period": Alias("trainer.ckpt_interval"),
        "checkpointing.keep_top_k": ByRule("trainer.max_ckpts_to_keep (the newest is kept as well)"),
        "checkpointing.metric_name": ByRule("trainer.ckpt_keep_metric (val:<name> is val_<name>)"),
        "checkpointing.higher_is_better": ByRule("trainer.ckpt_keep_higher_is_better"),
        "checkpointing.checkpoint_must_save_by": feature_off("a deadline for the last checkpoint", "remove it"),
        "checkpointing.model_save_format": ignored("checkpoints have one format here"),
        "checkpointing.save_consolidated": ByRule("true: trainer.hf_save_interval = save_period"),
        "checkpointing.save_optimizer": only(
            (True,),
            "checkpoints hold the optimizer state, as here",
            "checkpoints without the optimizer state",
            "remove it",
        ),
        "logger.*": ByRule("trainer.logger, trainer.project_name, trainer.run_name"),
        "cluster.gpus_per_node": Alias("trainer.placement.policy_num_gpus_per_node"),
        "cluster.num_nodes": Alias("trainer.placement.policy_num_nodes"),
        "cluster.master_port_range_low": ignored("ports are picked by Ray here"),
        "cluster.master_port_range_high": ignored("ports are picked by Ray here"),
        "cluster.segment_size": feature_off("NVLink-segment-aware placement", "remove it"),
        **{
            f"data.{name}": ByRule(
                "data.train_data, data.val_data, data.prompt_key, data.answer_key, data.prompt_template_file, "
                "data.system_prompt_file"
            )
            for name in DATA_KEYS
        },
        "env.*": ByRule("data.reward_fn and data.reward_num_workers"),
        "reward_penalties.*": feature_off("NeMo-Gym reward penalties", "remove them", (False, None)),
        "data_plane.enabled": feature_off("NeMo RL's TransferQueue data plane", "remove it"),
        "on_policy_distillation": feature_off(
            "multi-teacher on-policy distillation",
            "for one teacher set trainer.ref.model.path with "
            "trainer.algorithm.use_kl_in_reward=true, "
            "advantage_estimator=no_op and policy_loss_type=importance_sampling",
        ),
        "on_policy_distillation.*": Refused(
            "multi-teacher on-policy distillation",
            "for one teacher set trainer.ref.model.path with trainer.algorithm.use_kl_in_reward=true",
        ),
        "algorithm.batch_size": ByRule("trainer.micro_train_batch_size_per_gpu (seed 003)"),
        "algorithm.gradient_accumulation_steps": ByRule(
            "trainer.policy_mini_batch_size = batch_size x steps x DP / samples per prompt (seed 003)"
        ),
    }


@functools.cache
def _own_table() -> dict[str, Entry]:
    found: dict[str, Entry] = {}
    for part in (_megatron(), _generation(), _grpo(), _loss(), _policy(), _run()):
        found.update(part)
    for prefix in DTENSOR:
        found.update(_dtensor(prefix))
    found.update(
        {
            "sft.*": Elsewhere("supervised fine-tuning (SFT)", _SFT),
            "dpo.*": Elsewhere("preference training (DPO)", _DPO),
            "rm.*": Elsewhere(
                "reward-model training",
                "this launcher trains GRPO and PPO; reward models are used "
                "(trainer.reward.model.path), not trained, here",
            ),
            "distillation.*": Elsewhere(
                "off-policy distillation",
                "this launcher trains GRPO and PPO; on-policy "
                "distillation is trainer.ref.model.path with trainer.algorithm.use_kl_in_reward",
            ),
            "eval.*": Elsewhere(
                "evaluation-only run",
                "evaluation here runs inside training (trainer.eval_interval, trainer.eval_before_train)",
            ),
        }
    )
    return found


def table() -> Mapping[str, Entry]:
    """This table with the registered strategies' NeMo RL keys (which are aliases of their blocks' keys)."""
    found = dict(_own_table())
    for name in strategies.STRATEGIES:
        found.update({key: Alias(target) for key, target in strategies.STRATEGIES.get(name).nemo_keys.items()})
    return found


def switches() -> Mapping[str, str]:
    return {
        block: block + ".enabled"
        for block in (
            MC + "fp8_cfg",
            P + "draft",
            "grpo.reward_shaping",
            "grpo.reward_scaling",
            "grpo.async_grpo",
            "data_plane",
            *(prefix + "lora_cfg" for prefix in DTENSOR),
            MC + "peft",
            P + "dynamic_batching",
            P + "sequence_packing",
        )
    }


NAMESPACES = (
    "policy",
    "grpo",
    "loss_fn",
    "checkpointing",
    "cluster",
    "logger",
    "env",
    "reward_penalties",
    "data_plane",
    "on_policy_distillation",
    "algorithm",
    "sft",
    "dpo",
    "rm",
    "distillation",
    "eval",
)
"""Top-level sections that only NeMo RL's configs have (a file holding one is read the NeMo RL way)."""
