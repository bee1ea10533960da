"""Other projects' configs as their users run them, keys and values only, for the dialect tests (SkyRL's example
scripts: `skyrl_scripts`).

NeMo RL's two 1B recipes are the YAML files in `upstream/`. SKYRL_DEFAULTS: SkyRL's keys that are
not ours, at SkyRL's defaults. SEED_KEYS: the keys the seed documents use, with their values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

UPSTREAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "upstream")
NEMO_1B = os.path.join(UPSTREAM, "grpo_math_1B.yaml")
NEMO_1B_MEGATRON = os.path.join(UPSTREAM, "grpo_math_1B_megatron.yaml")


@dataclass(frozen=True)
class Seed:
    source: str
    """The seed document and its section."""
    overrides: list[str] = field(default_factory=list)
    yaml: str = ""
    """A config file, when the seed shows one."""


SEED_KEYS = {
    "seed000_memory": Seed("seed 000, memory section", ["trainer.policy.gradient_checkpointing=true"]),
    "seed002_fsdp": Seed("seed 002, strategies", ["trainer.strategy=fsdp"]),
    "seed003_basic": Seed(
        "seed 003, basic example",
        yaml="""
policy:
  model_name: Qwen/Qwen2.5-1.5B
  max_seq_length: 1024
  megatron_cfg:
    enabled: true
algorithm:
  batch_size: 4
  gradient_accumulation_steps: 8
""",
    ),
    "seed003_advanced": Seed(
        "seed 003, advanced example",
        yaml="""
policy:
  model_name: Qwen/Qwen2.5-1.5B
  max_seq_length: 2048
  megatron_cfg:
    enabled: true
    tensor_model_parallel_size: 2
    pipeline_model_parallel_size: 2
    optimizer:
      lr: 1.0e-6
      weight_decay: 0.01
      adam_beta1: 0.9
      adam_beta2: 0.98
      clip_grad: 1.0
    scheduler:
      lr_warmup_iters: 10
      lr_decay_style: constant
cluster:
  gpus_per_node: 8
  num_nodes: 1
algorithm:
  batch_size: 2
  gradient_accumulation_steps: 4
""",
    ),
    "seed003_both_enabled": Seed(
        "seed 003, both backends enabled", ["policy.dtensor_cfg.enabled=true", "policy.megatron_cfg.enabled=true"]
    ),
    "seed004_moe": Seed(
        "seed 004, MoE recipe",
        [
            "trainer.strategy=megatron",
            "trainer.policy.megatron_config.transformer_config_kwargs.recompute_modules=['ffn']",
            "trainer.policy.megatron_config.transformer_config_kwargs.recompute_granularity=selective",
            "trainer.policy.megatron_config.empty_cuda_cache=true",
        ],
    ),
}


SKYRL_DEFAULTS = {
    "data.dataloader.num_workers": None,
    "data.dataloader.persistent_workers": False,
    "trainer.use_expandable_segments": True,
    "trainer.sequence_parallel_backend": "ulysses",
    "trainer.policy.model.lora.lora_sync_path": "/tmp/skyrl_lora_sync",
    "trainer.policy.model.lora.max_loras": 1,
    "trainer.policy.model.lora.max_cpu_loras": None,
    "trainer.policy.model.fake_int4_qat.enabled": False,
    "trainer.policy.model.fake_int4_qat.group_size": 32,
    "trainer.policy.model.fake_int4_qat.symmetric": True,
    "trainer.policy.model.fake_int4_qat.scale_divisor": 7.5,
    "trainer.policy.model.fake_int4_qat.q_min": -8.0,
    "trainer.policy.model.fake_int4_qat.bf16_base_path": None,
    "trainer.policy.optimizer_config.adam_betas": [0.9, 0.999],
    "trainer.policy.optimizer_config.offload_after_step": True,
    "trainer.policy.optimizer_config.num_warmup_steps": 0,
    "trainer.policy.optimizer_config.scheduler": "constant_with_warmup",
    "trainer.policy.fsdp_config.mixed_precision.param_dtype": "bf16",
    "trainer.policy.fsdp_config.mixed_precision.reduce_dtype": "fp32",
    "trainer.policy.fsdp_config.mixed_precision.buffer_dtype": "fp32",
    "trainer.policy.fsdp_config.wrap_policy": {},
    "trainer.policy.use_torch_compile": False,
    "trainer.policy.record_memory": False,
    "trainer.policy.torch_profiler_config.enable": False,
    "trainer.policy.torch_profiler_config.ranks": [0],
    "trainer.policy.torch_profiler_config.save_path": None,
    "trainer.policy.torch_profiler_config.skip_first": 10,
    "trainer.policy.torch_profiler_config.wait": 0,
    "trainer.policy.torch_profiler_config.warmup": 1,
    "trainer.policy.torch_profiler_config.active": 1,
    "trainer.policy.torch_profiler_config.repeat": 1,
    "trainer.policy.torch_profiler_config.activities": ["cpu", "cuda"],
    "trainer.policy.torch_profiler_config.record_shapes": True,
    "trainer.policy.torch_profiler_config.profile_memory": False,
    "trainer.policy.torch_profiler_config.with_stack": True,
    "trainer.policy.torch_profiler_config.with_flops": False,
    "trainer.policy.torch_profiler_config.with_modules": False,
    "trainer.policy.torch_profiler_config.export_type": "chrome_trace",
    "trainer.policy.megatron_config.expert_tensor_parallel_size": None,
    "trainer.policy.megatron_config.moe_token_dispatcher_type": "alltoall",
    "trainer.policy.megatron_config.moe_router_load_balancing_type": "none",
    "trainer.policy.megatron_config.moe_aux_loss_coeff": 0.0,
    "trainer.policy.megatron_config.moe_grouped_gemm": True,
    "trainer.policy.megatron_config.moe_router_score_function": None,
    "trainer.policy.megatron_config.moe_router_enable_expert_bias": None,
    "trainer.policy.megatron_config.moe_enable_routing_replay": False,
    "trainer.policy.megatron_config.moe_per_layer_logging": False,
    "trainer.policy.megatron_config.moe_router_dtype": "fp32",
    "trainer.policy.megatron_config.ddp_config.grad_reduce_in_fp32": True,
    "trainer.policy.megatron_config.ddp_config.overlap_grad_reduce": False,
    "trainer.policy.megatron_config.ddp_config.overlap_param_gather": False,
    "trainer.policy.megatron_config.ddp_config.average_in_collective": True,
    "trainer.policy.megatron_config.hf_export_config.distributed_save": False,
    "trainer.policy.megatron_config.hf_export_config.save_every_n_ranks": 1,
    "trainer.policy.megatron_config.lora_config.lora_type": "lora",
    "trainer.policy.megatron_config.lora_config.merge_lora": True,
    "trainer.policy.megatron_config.optimizer_config_kwargs": {
        "overlap_cpu_optimizer_d2h_h2d": False,
        "use_precision_aware_optimizer": False,
        "optimizer_cpu_offload": False,
        "optimizer_offload_fraction": 0.0,
    },
    "trainer.policy.megatron_config.empty_cuda_cache": True,
    "trainer.policy.megatron_config.model_config_kwargs": {},
    "trainer.policy.megatron_config.dist_ckpt_optim_fully_reshardable": False,
    "trainer.policy.megatron_config.freeze_moe_router": False,
    "trainer.policy.megatron_config.mtp_num_layers": None,
    "trainer.policy.megatron_config.mtp_loss_weight": 0.1,
    "trainer.policy.megatron_config.mtp_loss_chunk_size": 1024,
    "trainer.policy.megatron_config.mtp_loss_topk": None,
    "trainer.policy.megatron_config.async_dist_ckpt_save": False,
    "trainer.policy.megatron_config.async_dist_ckpt_strategy": "mcore",
    "trainer.policy.megatron_config.async_save_prestage_to_cpu": False,
    "trainer.policy.model_config_kwargs": {},
    "trainer.policy.language_model_only": False,
    "trainer.policy.inference_only_init": False,
    "trainer.ref.model.lora.rank": 0,
    "trainer.ref.model.lora.alpha": 16,
    "trainer.ref.model.lora.dropout": 0.0,
    "trainer.ref.model.lora.lora_sync_path": "/tmp/skyrl_lora_sync",
    "trainer.ref.model.lora.target_modules": "all-linear",
    "trainer.ref.model.lora.exclude_modules": None,
    "trainer.ref.model.lora.init_method": "kaiming",
    "trainer.ref.model.lora.max_loras": 1,
    "trainer.ref.model.lora.max_cpu_loras": None,
    "trainer.ref.model.fake_int4_qat.enabled": False,
    "trainer.ref.model.fake_int4_qat.group_size": 32,
    "trainer.ref.model.fake_int4_qat.symmetric": True,
    "trainer.ref.model.fake_int4_qat.scale_divisor": 7.5,
    "trainer.ref.model.fake_int4_qat.q_min": -8.0,
    "trainer.ref.model.fake_int4_qat.bf16_base_path": None,
    "trainer.ref.sequence_parallel_size": 1,
    "trainer.ref.fsdp_config.mixed_precision.param_dtype": "bf16",
    "trainer.ref.fsdp_config.mixed_precision.reduce_dtype": "fp32",
    "trainer.ref.fsdp_config.mixed_precision.buffer_dtype": "fp32",
    "trainer.ref.fsdp_config.wrap_policy": {},
    "trainer.ref.megatron_config.tensor_model_parallel_size": 1,
    "trainer.ref.megatron_config.pipeline_model_parallel_size": 1,
    "trainer.ref.megatron_config.context_parallel_size": 1,
    "trainer.ref.megatron_config.expert_model_parallel_size": 1,
    "trainer.ref.megatron_config.expert_tensor_parallel_size": None,
    "trainer.ref.megatron_config.moe_token_dispatcher_type": "alltoall",
    "trainer.ref.megatron_config.moe_router_load_balancing_type": "none",
    "trainer.ref.megatron_config.moe_aux_loss_coeff": 0.0,
    "trainer.ref.megatron_config.moe_grouped_gemm": True,
    "trainer.ref.megatron_config.moe_router_score_function": None,
    "trainer.ref.megatron_config.moe_router_enable_expert_bias": None,
    "trainer.ref.megatron_config.moe_enable_routing_replay": False,
    "trainer.ref.megatron_config.moe_per_layer_logging": False,
    "trainer.ref.megatron_config.moe_router_dtype": "fp32",
    "trainer.ref.megatron_config.ddp_config.grad_reduce_in_fp32": True,
    "trainer.ref.megatron_config.ddp_config.overlap_grad_reduce": False,
    "trainer.ref.megatron_config.ddp_config.overlap_param_gather": False,
    "trainer.ref.megatron_config.ddp_config.average_in_collective": True,
    "trainer.ref.megatron_config.hf_export_config.distributed_save": False,
    "trainer.ref.megatron_config.hf_export_config.save_every_n_ranks": 1,
    "trainer.ref.megatron_config.lora_config.lora_type": "lora",
    "trainer.ref.megatron_config.lora_config.merge_lora": True,
    "trainer.ref.megatron_config.optimizer_config_kwargs": {
        "overlap_cpu_optimizer_d2h_h2d": False,
        "use_precision_aware_optimizer": False,
        "optimizer_cpu_offload": False,
        "optimizer_offload_fraction": 0.0,
    },
    "trainer.ref.megatron_config.transformer_config_kwargs": {
        "recompute_granularity": "full",
        "recompute_modules": ["core_attn"],
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
        "gradient_accumulation_fusion": False,
    },
    "trainer.ref.megatron_config.empty_cuda_cache": True,
    "trainer.ref.megatron_config.model_config_kwargs": {},
    "trainer.ref.megatron_config.dist_ckpt_optim_fully_reshardable": False,
    "trainer.ref.megatron_config.freeze_moe_router": False,
    "trainer.ref.megatron_config.mtp_num_layers": None,
    "trainer.ref.megatron_config.mtp_loss_weight": 0.1,
    "trainer.ref.megatron_config.mtp_loss_chunk_size": 1024,
    "trainer.ref.megatron_config.mtp_loss_topk": None,
    "trainer.ref.megatron_config.async_dist_ckpt_save": False,
    "trainer.ref.megatron_config.async_dist_ckpt_strategy": "mcore",
    "trainer.ref.megatron_config.async_save_prestage_to_cpu": False,
    "trainer.ref.model_config_kwargs": {},
    "trainer.ref.language_model_only": False,
    "trainer.critic.model.lora.lora_sync_path": "/tmp/skyrl_lora_sync",
    "trainer.critic.model.lora.max_loras": 1,
    "trainer.critic.model.lora.max_cpu_loras": None,
    "trainer.critic.model.fake_int4_qat.enabled": False,
    "trainer.critic.model.fake_int4_qat.group_size": 32,
    "trainer.critic.model.fake_int4_qat.symmetric": True,
    "trainer.critic.model.fake_int4_qat.scale_divisor": 7.5,
    "trainer.critic.model.fake_int4_qat.q_min": -8.0,
    "trainer.critic.model.fake_int4_qat.bf16_base_path": None,
    "trainer.critic.optimizer_config.adam_betas": [0.9, 0.999],
    "trainer.critic.optimizer_config.offload_after_step": True,
    "trainer.critic.optimizer_config.num_warmup_steps": 0,
    "trainer.critic.optimizer_config.scheduler": "constant_with_warmup",
    "trainer.critic.fsdp_config.mixed_precision.param_dtype": "bf16",
    "trainer.critic.fsdp_config.mixed_precision.reduce_dtype": "fp32",
    "trainer.critic.fsdp_config.mixed_precision.buffer_dtype": "fp32",
    "trainer.critic.fsdp_config.wrap_policy": {},
    "trainer.critic.model_config_kwargs": {},
    "trainer.algorithm.temperature": None,
    "trainer.algorithm.advantage_batch_normalize": False,
    "trainer.algorithm.value_head_prefix": "value_head",
    "trainer.algorithm.zero_variance_filter": False,
    "trainer.algorithm.zero_variance_filter_tol": 1e-06,
    "trainer.algorithm.tis_imp_ratio_cap": -1.0,
    "trainer.algorithm.use_tis": False,
    "trainer.algorithm.cispo.cispo_eps_clip_low": 1.0,
    "trainer.algorithm.cispo.cispo_eps_clip_high": 4.0,
    "trainer.algorithm.cispo.cispo_anchor": "old",
    "trainer.algorithm.dppo.dppo_type": "binary_tv",
    "trainer.algorithm.dppo.delta_low": 0.2,
    "trainer.algorithm.dppo.delta_high": 0.2,
    "trainer.algorithm.max_seq_len": None,
    "trainer.mtp.enabled": False,
    "trainer.mtp.num_speculative_tokens": 1,
    "trainer.mtp.loss_weight": 0.1,
    "trainer.fully_async.num_parallel_generation_workers": 768,
    "trainer.fully_async.sample_full_batch": False,
    "trainer.fully_async.clear_kv_cache_on_weight_sync": False,
    "trainer.fully_async.simulate_training": False,
    "trainer.fully_async.simulate_training_step_seconds": 30.0,
    "trainer.fully_async.simulate_weight_sync_seconds": 0.0,
    "trainer.gradient_checkpointing_use_reentrant": False,
    "trainer.resume_path": None,
    "trainer.log_path": "/tmp/skyrl-logs",
    "trainer.max_ckpts_to_keep": -1,
    "trainer.max_training_steps": None,
    "trainer.max_tokens_per_microbatch": -1,
    "trainer.recompute_old_logprobs_per_minibatch": True,
    "trainer.update_ref_every_epoch": False,
    "trainer.remove_microbatch_padding": True,
    "trainer.eval_batch_size": 1024,
    "trainer.max_prompt_length": 512,
    "trainer.disable_fast_tokenizer": False,
    "trainer.enable_ray_gpu_monitor": True,
    "trainer.tags": None,
    "trainer.dump_data_batch": False,
    "trainer.dump_eval_results": True,
    "trainer.print_example_interval": 1,
    "trainer.num_logger_eval_samples": -1,
    "trainer.num_logger_train_samples": -1,
    "trainer.log_example_interval": -1,
    "trainer.logprobs_chunk_size": 1024,
    "trainer.vocab_entropy_chunk_size": 0,
    "trainer.vocab_entropy_chunk_memory_mb": 512,
    "trainer.fused_lm_head_logprob": False,
    "trainer.fused_lm_head_logprob_backend": "torch",
    "generator.inference_engine.model_dtype": "bfloat16",
    "generator.inference_engine.run_engines_locally": True,
    "generator.inference_engine.num_engines": 1,
    "generator.inference_engine.backend": "vllm",
    "generator.inference_engine.weight_sync_backend": "nccl",
    "generator.inference_engine.weight_transfer_threshold_cuda_ipc_GB": 1.0,
    "generator.inference_engine.delta_weight_sync.local_checkpoint_dir": None,
    "generator.inference_engine.delta_weight_sync.publish_staging_dir": None,
    "generator.inference_engine.delta_weight_sync.max_file_size_in_gb": 1.0,
    "generator.inference_engine.delta_weight_sync.cloud_download_workers": 4,
    "generator.inference_engine.delta_weight_sync.publish_num_workers": None,
    "generator.inference_engine.delta_weight_sync.checkpoint_load_format": "vllm_multi_thread_safetensors",
    "generator.inference_engine.delta_weight_sync.multi_thread_safetensors_max_workers": 8,
    "generator.inference_engine.tensor_parallel_size": 1,
    "generator.inference_engine.pipeline_parallel_size": 1,
    "generator.inference_engine.expert_parallel_size": 1,
    "generator.inference_engine.data_parallel_size": 1,
    "generator.inference_engine.vllm_v1_disable_multiproc": True,
    "generator.inference_engine.enable_prefix_caching": True,
    "generator.inference_engine.enable_chunked_prefill": True,
    "generator.inference_engine.enable_return_routed_experts": False,
    "generator.inference_engine.max_num_batched_tokens": 8192,
    "generator.inference_engine.enforce_eager": False,
    "generator.inference_engine.fully_sharded_loras": False,
    "generator.inference_engine.enable_ray_prometheus_stats": True,
    "generator.inference_engine.gpu_memory_utilization": 0.8,
    "generator.inference_engine.offload_kv_for_weight_sync": False,
    "generator.inference_engine.use_expandable_segments": False,
    "generator.inference_engine.max_num_seqs": 1024,
    "generator.inference_engine.served_model_name": None,
    "generator.inference_engine.distributed_executor_backend": "ray",
    "generator.inference_engine.language_model_only": False,
    "generator.inference_engine.engine_init_kwargs": {},
    "generator.inference_engine.speculative_config": None,
    "generator.inference_engine.external_proxy_url": None,
    "generator.inference_engine.external_server_urls": None,
    "generator.inference_engine.enable_pd": False,
    "generator.inference_engine.num_prefill": 0,
    "generator.inference_engine.router_init_kwargs": {},
    "generator.batched": False,
    "generator.chat_template.source": "name",
    "generator.chat_template.name_or_path": None,
    "generator.chat_template_kwargs": {},
    "generator.sampling_params.max_generate_length": 1024,
    "generator.sampling_params.repetition_penalty": 1.0,
    "generator.sampling_params.temperature": 1.0,
    "generator.sampling_params.top_p": 1.0,
    "generator.sampling_params.min_p": 0.0,
    "generator.sampling_params.top_k": -1,
    "generator.sampling_params.logprobs": 1,
    "generator.sampling_params.stop": None,
    "generator.sampling_params.additional_kwargs": None,
    "generator.use_conversation_multi_turn": True,
    "generator.append_eos_token_after_stop_str_in_multi_turn": True,
    "generator.eval_sampling_params.max_generate_length": 1024,
    "generator.eval_sampling_params.repetition_penalty": 1.0,
    "generator.eval_sampling_params.temperature": 1.0,
    "generator.eval_sampling_params.top_p": 1.0,
    "generator.eval_sampling_params.min_p": 0.0,
    "generator.eval_sampling_params.top_k": -1,
    "generator.eval_sampling_params.logprobs": 1,
    "generator.eval_sampling_params.stop": None,
    "generator.eval_sampling_params.additional_kwargs": None,
    "generator.zero_reward_on_non_stop": False,
    "generator.use_cache_salt": True,
    "generator.step_wise_trajectories": False,
    "generator.vision_language_generator": False,
    "generator.merge_stepwise_output": False,
    "environment.skyrl_gym.max_env_workers": 32,
    "environment.skyrl_gym.llm_as_a_judge.model": "gpt-4o-mini",
    "environment.skyrl_gym.llm_as_a_judge.base_url": None,
}
"""Every key of SkyRL's typed config (`skyrl/train/config/config.py`) that is not a key of ours, at SkyRL's default."""
