"""Validation of a built config: every check runs, and all problems are raised together in one ConfigError.

Rules (world = trainer.placement.policy_num_nodes * policy_num_gpus_per_node):
- values: names from rl/core/config/choices.py and the strategy registry; batch sizes, lengths, sample counts >= 1;
  lr, weight_decay, max_grad_norm, eps_clip_*, kl/entropy coefficients >= 0; clip_ratio_c > 1; gamma and lambd in
  [0, 1]; temperature > 0; eval_temperature >= 0 (0 = greedy); top_p in (0, 1]; top_k -1 or >= 1; betas two
  numbers in [0, 1); resume_mode none, latest or an existing directory; data.prompt_template_file and
  data.system_prompt_file readable, non-empty UTF-8 text, the template with exactly one `{}`.
- batches: train_batch_size % policy_mini_batch_size == 0 and (policy_mini_batch_size * n_samples_per_prompt) %
  (micro_train_batch_size_per_gpu * DP) == 0, with DP = world / the strategy's model-parallel size.
- strategy (checks_backends.py): knobs of a strategy that is not selected are errors; the selected strategy checks
  its own blocks (parallel layouts, offload limits, ...) and refuses options it does not implement.
- algorithm: grpo and rloo need n_samples_per_prompt >= 2; use_kl_in_reward not with use_kl_loss; clip_cov_lb <
  clip_cov_ub; no TIS with clip_cov / kl_cov; trainer.policy.use_fused_kernels only with a loss that has a kernel
  formula (regular, dual_clip, cispo).
- placement: the reference on the policy's workers, or on a group of its own (colocate_policy_ref=false);
  fully_async needs colocate_all false; colocated vLLM engines fit the policy's devices.
- rewards: reward_weights one per reward_fn; a reward timeout needs reward workers; dynamic sampling needs
  n_samples_per_prompt >= 2; overlong_buffer.len below max_generate_length. Reward functions themselves (import,
  signature) are checked before the run starts (rl/trainer/preflight/checks.py).
- critic (checks_critic.py): its keys only with advantage_estimator gae; on the policy's workers (the same
  placement) or a group of its own (colocate_all=false); critic_mini_batch_size divides train_batch_size like the
  policy's; LoRA only where the strategy trains adapters.
- exact on-policy (checks_exact.py): the HF engine, fsdp/fsdp2/deepspeed, trainer.kernels auto, fp32, no fused
  hidden-state loss, no Ulysses, no LoRA, no top-k/top-p.
- this environment (checks_support.py): generator.backend vllm needs vLLM installed; trainer.flash_attn=true needs
  flash-attention where it can run (not megatron, the flash-attn package, trainer.bf16 not false).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rl.core.config import checks_backends, checks_combos, checks_critic, checks_exact, checks_support, checks_values
from rl.core.config.errors import Problems
from rl.core.config.schema import Config

logger = logging.getLogger("rl.core.config")

CHECKS: tuple[Callable[[Config, Problems], None], ...] = (
    checks_values.check_strategy_name,
    checks_values.check_rules,
    checks_values.check_fused_kernels,
    checks_values.check_strings,
    checks_values.check_lists,
    checks_values.check_resume_mode,
    checks_values.check_prompt_files,
    checks_combos.check_batch_sizes,
    checks_combos.check_token_budget,
    checks_combos.check_group_advantages,
    checks_combos.check_colocation,
    checks_combos.check_off_policy_bounds,
    checks_combos.check_kl_and_policy_loss,
    checks_combos.check_engine_devices,
    checks_combos.check_weight_sync_backend,
    checks_combos.check_engine_kwargs,
    checks_combos.check_reward_shaping,
    checks_combos.check_environment,
    checks_combos.check_reward_models,
    checks_combos.check_lora,
    checks_exact.check_exact_on_policy,
    checks_critic.check_critic,
    checks_backends.check_strategy,
    checks_support.check_unsupported,
    checks_support.check_flash_attn,
)


def collect_problems(cfg: Config) -> list[str]:
    """Every problem of a typed config, one line each (empty when it is valid); warnings (knobs that do nothing in
    this configuration) are logged."""
    problems = Problems()
    for check in CHECKS:
        check(cfg, problems)
    for warning in problems.warnings:
        logger.warning("%s", warning)
    return problems.lines


def validate_config(cfg: Config) -> None:
    """Raise ConfigError listing every problem of `cfg`, or return if there is none."""
    problems = Problems()
    problems.lines.extend(collect_problems(cfg))
    problems.raise_if_any()
