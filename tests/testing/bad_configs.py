"""Bad configs, one row per mistake: the overrides, the key the refusal must name, and words the same line must hold.
`tests/rl/core/config/test_config_errors.py` loads each row with `load_config`; the launcher catalogue
(`tests/rl/trainer/test_bad_input_catalogue.py`) runs each through `rl.launch.train` with its own rows beside them."""

from __future__ import annotations

from dataclasses import dataclass

WORLD_4 = ["trainer.placement.policy_num_gpus_per_node=4", "trainer.placement.ref_num_gpus_per_node=4"]
MEGATRON = "trainer.policy.megatron_config."
EXACT = "trainer.exact_on_policy=true"


@dataclass(frozen=True)
class Bad:
    overrides: list[str]
    key: str
    """The key the problem line must start with."""
    fragments: tuple[str, ...] = ()
    """Text the same line must contain (suggestions, fixes)."""
    strategy: str | None = None
    """`--strategy` on the command line."""


BAD = {
    # unknown keys, with suggestions
    "unknown_top_level": Bad(["trainr.seed=1"], "trainr.seed", ("did you mean 'trainer.seed'?",)),
    "unknown_nested": Bad(
        ["trainer.polcy.optimizer_config.lr=1e-6"],
        "trainer.polcy.optimizer_config.lr",
        ("did you mean 'trainer.policy.optimizer_config.lr'?",),
    ),
    "unknown_leaf": Bad(
        ["generator.temprature=0.7"],
        "generator.temprature",
        ("did you mean 'generator.temperature'?", "valid keys under generator"),
    ),
    "unknown_algorithm_key": Bad(
        ["trainer.algorithm.eps_clip=0.1"], "trainer.algorithm.eps_clip", ("did you mean 'trainer.algorithm.eps_clip_",)
    ),
    "key_below_a_leaf": Bad(["trainer.seed.value=1"], "trainer.seed.value", ("trainer.seed is a single value",)),
    "section_given_a_value": Bad(["trainer.policy=3"], "trainer.policy", ("is a section",)),
    "not_key_value": Bad(["trainer.seed"], "trainer.seed", ("not a key=value override",)),
    # wrong types
    "int_given_text": Bad(["trainer.seed=abc"], "trainer.seed", ("expected an integer", "'abc'")),
    "int_given_float": Bad(["trainer.seed=1.5"], "trainer.seed", ("expected an integer",)),
    "int_given_bool": Bad(["trainer.epochs=true"], "trainer.epochs", ("expected an integer",)),
    "float_given_list": Bad(
        ["trainer.algorithm.eps_clip_low=[1]"], "trainer.algorithm.eps_clip_low", ("expected a number",)
    ),
    "bool_given_maybe": Bad(
        ["trainer.use_sample_packing=maybe"], "trainer.use_sample_packing", ("expected true or false", "'maybe'")
    ),
    "list_given_mapping": Bad(["data.train_data={a: 1}"], "data.train_data", ("expected a list",)),
    # out of range
    "negative_lr": Bad(["trainer.policy.optimizer_config.lr=-1e-5"], "trainer.policy.optimizer_config.lr", (">= 0",)),
    "negative_eps_clip": Bad(["trainer.algorithm.eps_clip_low=-0.1"], "trainer.algorithm.eps_clip_low", (">= 0",)),
    "zero_temperature": Bad(["generator.temperature=0"], "generator.temperature", ("> 0",)),
    "zero_top_p": Bad(["generator.top_p=0"], "generator.top_p", ("(0, 1]",)),
    "top_p_above_one": Bad(["generator.top_p=1.01"], "generator.top_p", ("(0, 1]",)),
    "zero_top_k": Bad(["generator.top_k=0"], "generator.top_k", ("-1 (off)",)),
    "zero_samples": Bad(["generator.n_samples_per_prompt=0"], "generator.n_samples_per_prompt", (">= 1",)),
    "zero_generate_length": Bad(["generator.max_generate_length=0"], "generator.max_generate_length", (">= 1",)),
    "negative_prompt_length": Bad(["generator.max_prompt_length=-5"], "generator.max_prompt_length", (">= 1",)),
    "negative_kl_coef": Bad(
        ["trainer.algorithm.use_kl_loss=true", "trainer.algorithm.kl_loss_coef=-0.1"],
        "trainer.algorithm.kl_loss_coef",
        (">= 0",),
    ),
    "dual_clip_bound_not_above_one": Bad(
        ["trainer.algorithm.clip_ratio_c=1.0"], "trainer.algorithm.clip_ratio_c", ("> 1",)
    ),
    "gamma_above_one": Bad(["trainer.algorithm.gamma=1.5"], "trainer.algorithm.gamma", ("[0, 1]",)),
    "zero_max_steps": Bad(["trainer.max_steps=0"], "trainer.max_steps", ("null or",)),
    "short_betas": Bad(
        ["trainer.policy.optimizer_config.betas=[0.9]"],
        "trainer.policy.optimizer_config.betas",
        ("two numbers in [0, 1)",),
    ),
    "empty_train_data": Bad(["data.train_data=[]"], "data.train_data", ("is empty; give at least one file",)),
    # unknown names
    "unknown_strategy": Bad(["trainer.strategy=fsdp3"], "trainer.strategy", ("deepspeed, fsdp, fsdp2, megatron",)),
    "unknown_strategy_flag": Bad([], "trainer.strategy", ("did you mean 'megatron'?",), strategy="megatorn"),
    "unknown_estimator": Bad(
        ["trainer.algorithm.advantage_estimator=grpoo"],
        "trainer.algorithm.advantage_estimator",
        ("did you mean 'grpo'?",),
    ),
    "unknown_kl_estimator": Bad(
        ["trainer.algorithm.kl_estimator_type=k4"], "trainer.algorithm.kl_estimator_type", ("k1, k2, k3, abs",)
    ),
    "unknown_policy_loss": Bad(
        ["trainer.algorithm.policy_loss_type=dualclip"],
        "trainer.algorithm.policy_loss_type",
        ("did you mean 'dual_clip'?",),
    ),
    "unknown_reduction": Bad(
        ["trainer.algorithm.loss_reduction=seq_mean"],
        "trainer.algorithm.loss_reduction",
        ("token_mean, sequence_mean, seq_mean_token_sum_norm",),
    ),
    "unknown_kernels": Bad(["trainer.kernels=cutlass"], "trainer.kernels", ("auto, torch, triton, cuda",)),
    "unknown_logger": Bad(["trainer.logger=[console, wandbb]"], "trainer.logger[1]",
                          ("use any of: console, tensorboard, wandb (did you mean 'wandb'?)",)),
    "logger_twice": Bad(["trainer.logger=[console, console]"], "trainer.logger",
                        ("names a logger twice (['console', 'console']); list each once",)),
    "unknown_backend": Bad(["generator.backend=sglang"], "generator.backend", ("hf, vllm",)),
    "unknown_resume_mode": Bad(["trainer.resume_mode=lastest"], "trainer.resume_mode", ("did you mean 'latest'?",)),
    "unknown_recompute": Bad(
        ["trainer.strategy=megatron", MEGATRON + "recompute_granularity=partial"],
        MEGATRON + "recompute_granularity",
        ("full, selective",),
    ),
    # combinations
    "train_batch_not_multiple_of_mini": Bad(
        ["trainer.train_batch_size=20"], "trainer.train_batch_size", ("policy_mini_batch_size=16",)
    ),
    "mini_batch_not_split_by_micro": Bad(
        ["trainer.micro_train_batch_size_per_gpu=5"], "trainer.policy_mini_batch_size",
        ("= 128 sequences", "= 5", "e.g. set trainer.micro_train_batch_size_per_gpu=4")  # no mini-batch of 16 fits
    ),
    "mini_batch_not_split_over_dp": Bad(
        [
            *WORLD_4,
            "trainer.policy_mini_batch_size=2",
            "trainer.train_batch_size=16",
            "generator.n_samples_per_prompt=2",
            "trainer.micro_train_batch_size_per_gpu=2",
        ],
        "trainer.policy_mini_batch_size",
        ("data-parallel size 4",
         "e.g. set trainer.policy_mini_batch_size=4 or trainer.micro_train_batch_size_per_gpu=1"),
    ),
    "megatron_tp_pp_not_dividing_world": Bad(
        [*WORLD_4, "trainer.strategy=megatron", MEGATRON + "tensor_model_parallel_size=3"],
        MEGATRON + "tensor_model_parallel_size",
        ("TP 3 * PP 1 = 3 must divide the world size 4", "dense data-parallel size is world / (TP * PP)"),
    ),
    "megatron_experts_not_dividing_world": Bad(
        [
            *WORLD_4,
            "trainer.strategy=megatron",
            MEGATRON + "tensor_model_parallel_size=2",
            MEGATRON + "expert_model_parallel_size=4",
        ],
        MEGATRON + "expert_model_parallel_size",
        ("TP 2 * EP 4 * PP 1 = 8 must divide the world size 4", "world / (ETP * EP * PP)", "ETP equals TP"),
    ),
    "megatron_sequence_parallel_without_tp": Bad(
        ["trainer.strategy=megatron", MEGATRON + "sequence_parallel=true"],
        MEGATRON + "sequence_parallel",
        ("tensor_model_parallel_size > 1",),
    ),
    "megatron_with_kernels": Bad(
        ["trainer.strategy=megatron", "trainer.kernels=triton"],
        "trainer.kernels",
        ("uses no rl.kernels implementation; set it to auto",),
    ),
    "megatron_with_ulysses": Bad(
        [*WORLD_4, "trainer.strategy=megatron", "trainer.policy.sequence_parallel_size=2"],
        "trainer.policy.sequence_parallel_size",
        ("set it to 1, and use trainer.policy.megatron_config.context_parallel_size",),
    ),
    "megatron_cp_not_dividing_dp": Bad(
        [*WORLD_4, "trainer.strategy=megatron", MEGATRON + "tensor_model_parallel_size=2",
         MEGATRON + "context_parallel_size=4"],
        MEGATRON + "context_parallel_size", ("4 must divide the data-parallel size 2",),
    ),
    "megatron_cp_fused_loss": Bad(
        [*WORLD_4, "trainer.strategy=megatron", MEGATRON + "context_parallel_size=2",
         "trainer.policy.use_fused_kernels=true"],
        "trainer.policy.use_fused_kernels", ("does not run with context parallelism",),
    ),
    "ulysses_not_dividing_world": Bad(
        [*WORLD_4, "trainer.policy.sequence_parallel_size=3"],
        "trainer.policy.sequence_parallel_size",
        ("3 does not divide the policy's 4 workers",),
    ),
    "ulysses_padded": Bad(
        [*WORLD_4, "trainer.policy.sequence_parallel_size=2", "trainer.use_sample_packing=false"],
        "trainer.policy.sequence_parallel_size",
        ("set trainer.use_sample_packing=true",),
    ),
    "ulysses_fused_loss": Bad(
        [*WORLD_4, "trainer.policy.sequence_parallel_size=2", "trainer.policy.use_fused_kernels=true"],
        "trainer.policy.use_fused_kernels",
        ("does not run with sequence parallelism",),
    ),
    "fsdp1_policy_offload": Bad(
        ["trainer.strategy=fsdp", "trainer.policy.fsdp_config.cpu_offload=true"],
        "trainer.policy.fsdp_config.cpu_offload",
        ("no_sync", "trainer.strategy=fsdp2", "trainer.ref.fsdp_config.cpu_offload=true"),
    ),
    "megatron_knob_under_fsdp2": Bad(
        [MEGATRON + "tensor_model_parallel_size=2"],
        MEGATRON + "tensor_model_parallel_size",
        ("only applies to trainer.strategy=megatron",),
    ),
    "megatron_kwargs_under_deepspeed": Bad(
        ["trainer.strategy=deepspeed", MEGATRON + "transformer_config_kwargs={num_layers: 2}"],
        MEGATRON + "transformer_config_kwargs",
        ("trainer.strategy=megatron",),
    ),
    "fsdp_knob_under_megatron": Bad(
        ["trainer.strategy=megatron", "trainer.policy.fsdp_config.reshard_after_forward=false"],
        "trainer.policy.fsdp_config.reshard_after_forward",
        ("fsdp or fsdp2",),
    ),
    "ref_fsdp_knob_under_deepspeed": Bad(
        ["trainer.strategy=deepspeed", "trainer.ref.fsdp_config.cpu_offload=true"],
        "trainer.ref.fsdp_config.cpu_offload",
        ("fsdp or fsdp2",),
    ),
    "deepspeed_config_under_fsdp2": Bad(
        ["deepspeed_config.train.zero_optimization.stage=3"], "deepspeed_config.train", ("trainer.strategy=deepspeed",)
    ),
    "fsdp_size_not_dividing_world": Bad(
        [*WORLD_4, "trainer.policy.fsdp_config.fsdp_size=3"],
        "trainer.policy.fsdp_config.fsdp_size",
        ("use -1 (whole world)",),
    ),
    "ref_fsdp_size_not_dividing_world": Bad(
        ["trainer.ref.fsdp_config.fsdp_size=2"], "trainer.ref.fsdp_config.fsdp_size", ("ref world size 1",)
    ),
    "grpo_one_sample": Bad(
        ["generator.n_samples_per_prompt=1"], "generator.n_samples_per_prompt", ("every advantage is zero", "2 or more")
    ),
    "rloo_one_sample": Bad(
        ["trainer.algorithm.advantage_estimator=rloo", "generator.n_samples_per_prompt=1"],
        "generator.n_samples_per_prompt",
        ("leave-one-out",),
    ),
    "engine_tp_not_fitting": Bad(
        ["generator.backend=vllm", "generator.inference_engine_tensor_parallel_size=2"],
        "generator.inference_engine_tensor_parallel_size", ("does not divide the policy's 1 devices", "set it to 1")),
    "engines_not_fitting": Bad(
        ["generator.backend=vllm", "generator.num_inference_engines=2"],
        "generator.num_inference_engines", ("2 devices, more than the policy's 1 devices", "set it to 1 at most")),
    "engine_memory_fraction": Bad(["generator.gpu_memory_utilization=1.5"], "generator.gpu_memory_utilization",
                                  ("in (0, 1]",)),
    "engine_count": Bad(["generator.num_inference_engines=0"], "generator.num_inference_engines", (">= 1",)),
    "unknown_engine_key": Bad(["generator.num_inference_engine=2"], "generator.num_inference_engine",
                              ("num_inference_engines",)),
    "off_policy_token_mask_one_bound": Bad(
        ["trainer.algorithm.off_policy_correction.token_mask_is_threshold_low=0.5"],
        "trainer.algorithm.off_policy_correction.token_mask_is_threshold_high", ("needs both",)),
    "off_policy_unknown_tis": Bad(["trainer.algorithm.off_policy_correction.tis_ratio_type=tokens"],
                                  "trainer.algorithm.off_policy_correction.tis_ratio_type", ("token, sequence",)),
    "off_policy_bounds_reversed": Bad(
        ["trainer.algorithm.off_policy_correction.geo_mask_low=1.2"],
        "trainer.algorithm.off_policy_correction.geo_mask_low", ("must be below",)),
    # the critic
    "critic_without_gae": Bad(["trainer.critic.model.path=/tmp/critic"], "trainer.critic.model.path",
                              ("only trainer.algorithm.advantage_estimator=gae trains a critic",)),
    "critic_placement_apart": Bad(
        ["trainer.algorithm.advantage_estimator=gae", "trainer.placement.critic_num_gpus_per_node=2"],
        "trainer.placement.critic_num_gpus_per_node", ("runs on the policy's workers", "set it equal or null")),
    "critic_group_not_a_multiple": Bad(
        ["trainer.algorithm.advantage_estimator=gae", "trainer.placement.colocate_all=false",
         "trainer.strategy=megatron", f"{MEGATRON}tensor_model_parallel_size=2",
         "trainer.placement.policy_num_gpus_per_node=2", "trainer.placement.critic_num_gpus_per_node=3"],
        "trainer.placement.critic_num_gpus_per_node", ("not a multiple of its model-parallel size 2", "TP 2")),
    "critic_mini_batch_uneven": Bad(
        ["trainer.algorithm.advantage_estimator=gae", "trainer.critic_mini_batch_size=3"],
        "trainer.critic_mini_batch_size", ("divide trainer.train_batch_size=16; e.g. set it to 2",)),
    "ppo_epochs_zero": Bad(["trainer.update_epochs_per_batch=0"], "trainer.update_epochs_per_batch", (">= 1",)),
    "critic_lora_dropout": Bad(["trainer.algorithm.advantage_estimator=gae", "trainer.critic.model.lora.rank=8",
                                "trainer.critic.model.lora.dropout=1.5"],
                               "trainer.critic.model.lora.dropout", ("[0, 1)",)),
    # known keys whose feature this version does not run yet
    "ulysses_under_deepspeed": Bad(
        [*WORLD_4, "trainer.strategy=deepspeed", "trainer.policy.sequence_parallel_size=2"],
        "trainer.policy.sequence_parallel_size",
        ("does not implement Ulysses", "trainer.strategy=fsdp or fsdp2", "set it to 1"),
    ),
    "separate_reference_devices": Bad(
        ["trainer.placement.colocate_all=false", "trainer.placement.policy_num_gpus_per_node=2",
         "trainer.placement.ref_num_gpus_per_node=1"],
        "trainer.placement.ref_num_gpus_per_node", ("runs on the policy's workers",)),
    "own_reference_group_while_colocated": Bad(["trainer.placement.colocate_policy_ref=false"],
                                               "trainer.placement.colocate_policy_ref",
                                               ("set trainer.placement.colocate_all=false",)),
    "own_reference_group_without_a_reference": Bad(
        ["trainer.placement.colocate_all=false", "trainer.placement.colocate_policy_ref=false",
         "trainer.algorithm.use_kl_loss=false"], "trainer.placement.colocate_policy_ref", ("no reference model",)),
    "async_colocated": Bad(["trainer.fully_async.enabled=true"], "trainer.fully_async.enabled",
                           ("trainer.placement.colocate_all=false",)),
    "empty_stop_string": Bad(["generator.stop=['####','']"], "generator.stop", ("non-empty strings",)),
    "unknown_weight_sync_backend": Bad(["generator.weight_sync_backend=mpi"], "generator.weight_sync_backend",
                                       ("ipc, ray, gloo, nccl",)),
    "collective_weight_sync_with_colocated_engines": Bad(
        ["generator.backend=vllm", "generator.weight_sync_backend=gloo"], "generator.weight_sync_backend",
        ("nccl allows one rank per device",)),
    "weight_sync_backend_for_the_driver_engine": Bad(["generator.weight_sync_backend=ray"],
                                                     "generator.weight_sync_backend", ("runs in the driver",)),
    "negative_staleness": Bad(["trainer.fully_async.max_staleness_steps=-1"],
                              "trainer.fully_async.max_staleness_steps", (">= 0",)),
    "partial_rollouts_without_async": Bad(["trainer.fully_async.partial_rollout_tokens=8"],
                                          "trainer.fully_async.partial_rollout_tokens",
                                          ("only trainer.fully_async.enabled=true does",)),
    "token_budget_below_longest_sequence": Bad(
        ["trainer.max_tokens_per_micro_batch=100", "generator.max_prompt_length=64",
         "generator.max_generate_length=64"],
        "trainer.max_tokens_per_micro_batch", ("= 128; raise it to at least 128",)),
    "infinite_lr": Bad(["trainer.policy.optimizer_config.lr=.inf"], "trainer.policy.optimizer_config.lr",
                       ("got inf", "a number >= 0")),
    "nemo_batch_size_not_whole_prompts": Bad(["algorithm.batch_size=3"], "algorithm.batch_size",
                                             ("multiple of the samples per prompt", "trainer.policy_mini_batch_size")),
    "colocated_with_different_placements": Bad(
        ["trainer.placement.policy_num_gpus_per_node=2", "trainer.placement.ref_num_gpus_per_node=1"],
        "trainer.placement.colocate_all",
        ("trainer.placement.ref_num_gpus_per_node=2",),
    ),
    # more values out of range or of the wrong kind
    "negative_weight_decay": Bad(["trainer.policy.optimizer_config.weight_decay=-0.1"],
                                 "trainer.policy.optimizer_config.weight_decay", (">= 0",)),
    "negative_max_grad_norm": Bad(["trainer.policy.optimizer_config.max_grad_norm=-1"],
                                  "trainer.policy.optimizer_config.max_grad_norm", (">= 0",)),
    "negative_warmup": Bad(["trainer.policy.optimizer_config.lr_warmup_steps=-3"],
                           "trainer.policy.optimizer_config.lr_warmup_steps", ("an integer >= 0",)),
    "beta_above_one": Bad(["trainer.policy.optimizer_config.betas=[0.9, 1.5]"],
                          "trainer.policy.optimizer_config.betas", ("two numbers in [0, 1)",)),
    "interval_given_text": Bad(["trainer.ckpt_interval=often"], "trainer.ckpt_interval", ("expected an integer",)),
    "zero_epochs": Bad(["trainer.epochs=0"], "trainer.epochs", (">= 1",)),
    "zero_train_batch": Bad(["trainer.train_batch_size=0"], "trainer.train_batch_size", (">= 1",)),
    "zero_forward_micro_batch": Bad(["trainer.micro_forward_batch_size_per_gpu=0"],
                                    "trainer.micro_forward_batch_size_per_gpu", (">= 1",)),
    "zero_token_budget": Bad(["trainer.max_tokens_per_micro_batch=0"], "trainer.max_tokens_per_micro_batch",
                             ("null or an integer >= 1",)),
    "zero_fused_chunk": Bad(["trainer.policy.fused_kernel_chunk_size=0"], "trainer.policy.fused_kernel_chunk_size",
                            ("null or an integer >= 1",)),
    "fused_kernels_given_text": Bad(["trainer.policy.use_fused_kernels=sometimes"],
                                    "trainer.policy.use_fused_kernels", ("expected true or false",)),
    "norm_by_std_given_int": Bad(["trainer.algorithm.grpo_norm_by_std=1"], "trainer.algorithm.grpo_norm_by_std",
                                 ("expected true or false", "an integer")),
    "negative_entropy_coef": Bad(["trainer.algorithm.entropy_loss_coef=-1"], "trainer.algorithm.entropy_loss_coef",
                                 (">= 0",)),
    "lambda_above_one": Bad(["trainer.algorithm.lambd=2"], "trainer.algorithm.lambd", ("[0, 1]",)),
    "negative_seed": Bad(["trainer.seed=-1"], "trainer.seed", (">= 0",)),
    "unknown_sequence_mask": Bad(["trainer.algorithm.off_policy_correction.sequence_mask_metric=median"],
                                 "trainer.algorithm.off_policy_correction.sequence_mask_metric",
                                 ("geometric, product",)),
    "product_mask_bounds_reversed": Bad(["trainer.algorithm.off_policy_correction.product_mask_low=3"],
                                        "trainer.algorithm.off_policy_correction.product_mask_low",
                                        ("must be below",)),
    "zero_sync_bucket": Bad(["generator.weight_sync_bucket_mb=0"], "generator.weight_sync_bucket_mb", (">= 1",)),
    "zero_engine_sequences": Bad(["generator.max_num_seqs=0"], "generator.max_num_seqs", (">= 1",)),
    "zero_engine_tokens": Bad(["generator.max_num_batched_tokens=0"], "generator.max_num_batched_tokens", (">= 1",)),
    "zero_eval_samples": Bad(["generator.eval_n_samples_per_prompt=0"], "generator.eval_n_samples_per_prompt",
                             (">= 1",)),
    "negative_eval_temperature": Bad(["generator.eval_temperature=-1"], "generator.eval_temperature",
                                     ("0 = greedy decoding",)),
    "prefix_caching_given_text": Bad(["generator.enable_prefix_caching=perhaps"], "generator.enable_prefix_caching",
                                     ("expected true or false",)),
    "empty_prompt_key": Bad(["data.prompt_key="], "data.prompt_key", ("expected a string, got null",)),
    "empty_model_path": Bad(["trainer.policy.model.path="], "trainer.policy.model.path",
                            ("expected a string, got null",)),
    "zero_nodes": Bad(["trainer.placement.policy_num_nodes=0"], "trainer.placement.policy_num_nodes", (">= 1",)),
    "zero_devices": Bad(["trainer.placement.policy_num_gpus_per_node=0"],
                        "trainer.placement.policy_num_gpus_per_node", (">= 1",)),
    "no_logger": Bad(["trainer.logger=[]"], "trainer.logger", ("is empty; name at least one of: console, tensorboard, "
                                                              "wandb",)),
    "blank_project_name": Bad(["trainer.project_name=' '"], "trainer.project_name",
                              ("is empty; set it to a non-empty string",)),
    "blank_run_name": Bad(["trainer.run_name=' '"], "trainer.run_name",
                          ("is empty; set a name or null (derived from the time)",)),
    "blank_train_file": Bad(["data.train_data=[a.parquet, ' ']"], "data.train_data[1]",
                            ("is an empty path; remove it or give a file",)),
    "blank_reward_fn": Bad(["data.reward_fn=[gsm8k, ' ']"], "data.reward_fn[1]",
                           ("is empty; remove it or name a reward",)),
    "infinite_reward_weight": Bad(["data.reward_weights=[.inf]"], "data.reward_weights[0]",
                                  ("is inf; weights must be finite numbers",)),
    "beta_of_one": Bad(["trainer.policy.optimizer_config.betas=[0.9, 1.0]"], "trainer.policy.optimizer_config.betas",
                       ("two numbers in [0, 1)",)),
    "min_lr_above_lr": Bad(["trainer.policy.optimizer_config.scheduler=cosine",
                            "trainer.policy.optimizer_config.min_lr=1.0"], "trainer.policy.optimizer_config.min_lr",
                           ("is 1.0; give a rate in [0, lr=0.0002]",)),
    "fused_kernels_without_a_formula": Bad(
        ["trainer.policy.use_fused_kernels=true", "trainer.algorithm.policy_loss_type=gspo"],
        "trainer.policy.use_fused_kernels",
        ("has no kernel formula for trainer.algorithm.policy_loss_type='gspo' (it has: regular, dual_clip, cispo); "
         "set use_fused_kernels=false for it",)),
    "zero_fsdp_size": Bad(["trainer.policy.fsdp_config.fsdp_size=0"], "trainer.policy.fsdp_config.fsdp_size",
                          ("-1 (whole world)",)),
    "resume_path_missing": Bad(["trainer.resume_mode=/nonexistent/global_step_3"], "trainer.resume_mode",
                               ("neither none nor latest nor an existing checkpoint directory; fix the path or use "
                                "none / latest",)),
    "ref_unknown_key": Bad(["trainer.ref.model.paht=x"], "trainer.ref.model.paht", ("trainer.ref.model.path",)),
    # rewards and reward shaping
    "reward_weights_count": Bad(["data.reward_fn=[gsm8k, gsm8k_flexible]", "data.reward_weights=[1.0]"],
                                "data.reward_weights", ("1 weight(s) for 2 reward function(s)",)),
    "reward_timeout_in_driver": Bad(["data.reward_num_workers=0"], "data.reward_timeout_s",
                                    ("cannot be enforced with data.reward_num_workers=0 (rewards run in the driver); "
                                     "set data.reward_num_workers >= 1, or data.reward_timeout_s=null",)),
    "reward_on_error_unknown": Bad(["data.reward_on_error=ignore"], "data.reward_on_error", ("fail, zero",)),
    "non_finite_unknown": Bad(["trainer.non_finite=ignore"], "trainer.non_finite", ("fail, skip",)),
    "truncation_unknown": Bad(["data.truncation=drop"], "data.truncation", ("left, right, middle, error",)),
    "reward_fn_empty_list": Bad(["data.reward_fn=[]"], "data.reward_fn",
                                ("is empty; name a reward, e.g. data.reward_fn=gsm8k",)),
    "min_lr_without_a_decay": Bad(["trainer.policy.optimizer_config.min_lr=1e-7"],
                                  "trainer.policy.optimizer_config.min_lr",
                                  ("scheduler=constant does not decay", "cosine or linear")),
    "decay_ending_in_the_warm_up": Bad(
        ["trainer.critic.optimizer_config.scheduler=cosine", "trainer.critic.optimizer_config.lr_warmup_steps=10",
         "trainer.critic.optimizer_config.lr_decay_steps=10"], "trainer.critic.optimizer_config.lr_decay_steps",
        ("not past the 10 warm-up steps",)),
    "val_split_size_not_whole": Bad(["data.val_split_size=2.5"], "data.val_split_size",
                                    ("a fraction in (0, 1) or a whole number of rows",)),
    "val_split_size_between_one_and_two": Bad(["data.val_split_size=1.5"], "data.val_split_size",
                                              ("is 1.5; give 0 (no split)",)),
    "dynamic_sampling_unknown": Bad(["trainer.algorithm.dynamic_sampling.type=filtr"],
                                    "trainer.algorithm.dynamic_sampling.type", ("did you mean 'filter'?",)),
    "dynamic_sampling_one_sample": Bad(["trainer.algorithm.dynamic_sampling.type=filter",
                                        "generator.n_samples_per_prompt=1", "trainer.algorithm.advantage_estimator="
                                        "reinforce++"], "trainer.algorithm.dynamic_sampling.type",
                                       ("no groups to compare",)),
    "overlong_band_too_long": Bad(["trainer.algorithm.overlong_buffer.len=32"], "trainer.algorithm.overlong_buffer.len",
                                  ("not below generator.max_generate_length=32",)),
    "turns_without_environment": Bad(["generator.max_turns=2"], "generator.max_turns", ("nothing answers",)),
    "environment_options_without_class": Bad(["environment.env_options={attempts: 3}"], "environment.env_options",
                                             ("environment.env_class is null",)),
    "lora_negative_rank": Bad(["trainer.policy.model.lora.rank=-1"], "trainer.policy.model.lora.rank", (">= 0",)),
    "lora_dropout_one": Bad(["trainer.policy.model.lora.dropout=1"], "trainer.policy.model.lora.dropout",
                            ("[0, 1)",)),
    "lora_init_unknown": Bad(["trainer.policy.model.lora.init_method=xavier"], "trainer.policy.model.lora.init_method",
                             ("kaiming, gaussian",)),
    "lora_dropout_under_megatron": Bad(["trainer.policy.model.lora.rank=8", "trainer.policy.model.lora.dropout=0.1",
                                        "trainer.strategy=megatron"],
                                       "trainer.policy.model.lora.dropout", ("take no dropout",)),
    "lora_separate_reference": Bad(["trainer.policy.model.lora.rank=8", "trainer.placement.colocate_policy_ref=false",
                                    "trainer.placement.ref_num_nodes=1"], "trainer.placement.colocate_policy_ref",
                                   ("adapters off",)),
    "replace_ratio_zero": Bad(["trainer.algorithm.dynamic_sampling.min_replace_ratio=0"],
                              "trainer.algorithm.dynamic_sampling.min_replace_ratio", ("(0, 1]",)),
    # NeMo RL spellings
    "nemo_gpus_per_node_given_text": Bad(["cluster.gpus_per_node=two"], "trainer.placement.policy_num_gpus_per_node",
                                         ("expected an integer",)),
    "nemo_megatron_switch_given_text": Bad(["policy.megatron_cfg.enabled=maybe"], "policy.megatron_cfg.enabled",
                                           ("expected true or false",)),
    "nemo_accumulation_not_whole_prompts": Bad(["algorithm.batch_size=1", "algorithm.gradient_accumulation_steps=3"],
                                               "algorithm.gradient_accumulation_steps",
                                               ("batch_size 1 x gradient_accumulation_steps 3",)),
    "nemo_dataset_by_name": Bad(["data.train.dataset_name=OpenMathInstruct-2"], "data.train.dataset_name",
                                ("downloads by name", "data.train.data_path")),
    "nemo_prompt_file_missing": Bad(["data.default.prompt_file=prompts/missing_cot.txt"], "data.prompt_template_file",
                                    ("prompts/missing_cot.txt", "does not exist", "read from the working directory")),
    "nemo_sft_block": Bad(["sft.max_num_epochs=1", "sft.val_period=10"], "sft",
                          ("supervised fine-tuning (SFT)", "//rl/launch:sft")),
    # SkyRL spellings: suggestions by meaning (never a key of another meaning), missing features named
    "skyrl_engine_backend_typo": Bad(["generator.inference_engine.bakend=vllm"], "generator.inference_engine.bakend",
                                     ("did you mean 'generator.inference_engine.backend', SkyRL's name for "
                                      "generator.backend?",)),
    "skyrl_sampling_temperature_typo": Bad(["generator.sampling_params.temprature=0.7"],
                                           "generator.sampling_params.temprature",
                                           ("SkyRL's name for generator.temperature?",)),
    "skyrl_sampling_top_p_typo": Bad(["generator.sampling_params.top_pp=0.9"], "generator.sampling_params.top_pp",
                                     ("SkyRL's name for generator.top_p?",)),
    "skyrl_eval_batch_size_typo": Bad(["trainer.eval_batch_sze=8"], "trainer.eval_batch_sze",
                                      ("did you mean 'trainer.eval_batch_size', SkyRL's key",)),
    "skyrl_resume_from_path_without_path": Bad(["trainer.resume_mode=from_path"], "trainer.resume_mode",
                                               ("needs trainer.resume_path",)),
    "skyrl_keep_no_checkpoint": Bad(["trainer.max_ckpts_to_keep=0"], "trainer.max_ckpts_to_keep",
                                    ("-1 (keep every checkpoint) or an integer >= 1",)),
    "checkpoint_metric_keeping_everything": Bad(["trainer.ckpt_keep_metric=val_accuracy"], "trainer.ckpt_keep_metric",
                                                ("set max_ckpts_to_keep to the number to keep",)),
    "skyrl_dppo_loss": Bad(["trainer.algorithm.policy_loss_type=dppo"],
                           "trainer.algorithm.policy_loss_type", ("DPPO's divergence-masked loss",)),
    "skyrl_engine_argument_of_a_key": Bad(
        ["generator.backend=vllm", "generator.inference_engine.engine_init_kwargs.max_model_len=4096"],
        "generator.engine_init_kwargs.max_model_len",
        ("is set by generator.max_prompt_length + generator.max_generate_length: give that instead",)),
    "engine_arguments_for_hf": Bad(["generator.engine_init_kwargs={enforce_eager: false}"],
                                   "generator.engine_init_kwargs", ("generator.backend=hf", "generator.backend=vllm")),
    # strategy blocks, checked by the libraries' own definitions
    "deepspeed_stage_7": Bad(["trainer.strategy=deepspeed", "deepspeed_config.train.zero_optimization.stage=7"],
                             "deepspeed_config.train.zero_optimization.stage", ("DeepSpeed refuses it",)),
    "deepspeed_misspelt_section": Bad(
        ["trainer.strategy=deepspeed", "deepspeed_config.train.zero_optimisation.stage=2"],
        "deepspeed_config.train.zero_optimisation", ("did you mean 'zero_optimization'?",)),
    "deepspeed_unknown_zero_knob": Bad(
        ["trainer.strategy=deepspeed", "deepspeed_config.train.zero_optimization.stage3_prefetch_bucket=5"],
        "deepspeed_config.train.zero_optimization.stage3_prefetch_bucket", ("DeepSpeed refuses it",)),
    "megatron_unknown_transformer_field": Bad(
        ["trainer.strategy=megatron", MEGATRON + "transformer_config_kwargs={no_such_field: 1}"],
        MEGATRON + "transformer_config_kwargs.no_such_field", ("not a field of megatron-core's TransformerConfig",)),
    "megatron_recompute_module": Bad(
        ["trainer.strategy=megatron", MEGATRON + "transformer_config_kwargs={recompute_modules: [feedforward]}"],
        MEGATRON + "transformer_config_kwargs.recompute_modules", ("megatron-core refuses it",)),
    "megatron_interleaving_without_pipeline": Bad(
        ["trainer.strategy=megatron", MEGATRON + "virtual_pipeline_model_parallel_size=2"],
        MEGATRON + "virtual_pipeline_model_parallel_size", ("needs pipeline_model_parallel_size > 1",)),
    "megatron_zero_tp": Bad(["trainer.strategy=megatron", MEGATRON + "tensor_model_parallel_size=0"],
                            MEGATRON + "tensor_model_parallel_size", (">= 1",)),
    # mixed precision and attention kernels (SkyRL's trainer.bf16 / trainer.flash_attn)
    "bf16_given_maybe": Bad(["trainer.bf16=maybe"], "trainer.bf16", ("expected true or false",)),
    "flash_attn_under_megatron": Bad(["trainer.strategy=megatron", "trainer.flash_attn=true"], "trainer.flash_attn",
                                     ("megatron computes attention with its own", "set trainer.flash_attn=null")),
    "flash_attn_in_float32": Bad(["trainer.flash_attn=true", "trainer.bf16=false"], "trainer.flash_attn",
                                 ("bf16 and fp16 only", "set trainer.bf16=true")),
    # exact on-policy (checks_exact.py): what cannot give the engine's logprobs to the bit
    "exact_with_vllm": Bad([EXACT, "generator.backend=vllm"], "generator.backend",
                           ("kernels of its own", "set generator.backend=hf")),
    "exact_under_megatron": Bad([EXACT, "trainer.strategy=megatron"], "trainer.strategy",
                                ("runs layers of its own", "runs the Hugging Face model")),
    "exact_with_kernels_named": Bad([EXACT, "trainer.kernels=torch"], "trainer.kernels",
                                    ("leave trainer.kernels=auto",)),
    "exact_in_bf16": Bad([EXACT, "trainer.bf16=true"], "trainer.bf16", ("set trainer.bf16=false",)),
    "exact_with_fused_loss": Bad([EXACT, "trainer.policy.use_fused_kernels=true"], "trainer.policy.use_fused_kernels",
                                 ("sums the vocabulary in chunks",)),
    "exact_with_ulysses": Bad([EXACT, *WORLD_4, "trainer.policy.sequence_parallel_size=2"],
                              "trainer.policy.sequence_parallel_size", ("set it to 1",)),
    "exact_with_lora": Bad([EXACT, "trainer.policy.model.lora.rank=8"], "trainer.policy.model.lora.rank",
                           ("merged weights",)),
    "exact_with_top_k": Bad([EXACT, "generator.top_k=1"], "generator.top_k",
                            ("truncated, renormalised distribution",)),
    "exact_with_top_p": Bad([EXACT, "generator.top_p=0.9"], "generator.top_p",
                            ("truncated, renormalised distribution", "generator.top_p=1.0")),
    "exact_with_one_lora_rank": Bad([EXACT, "trainer.policy.model.lora.rank=1"], "trainer.policy.model.lora.rank",
                                    ("merged weights",)),
}
