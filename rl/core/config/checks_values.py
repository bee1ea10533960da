"""Checks of single values: ranges and names, as a table of rules."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rl.core.config import choices, strategies
from rl.core.config.defaults import get
from rl.core.config.errors import Problems, did_you_mean
from rl.core.config.schema import Config
from rl.core.data.templates import SYSTEM_KEY, TEMPLATE_KEY, prompt_file_problem


@dataclass(frozen=True)
class Rule:
    """`key` must satisfy `ok`; `requirement` completes "set it to ..." in the error."""

    key: str
    ok: Callable[[Any], bool]
    requirement: str
    names: Sequence[str] = ()
    """Valid names, for a did-you-mean hint."""


def at_least(key: str, low: float, what: str = "an integer") -> Rule:
    return Rule(key, lambda v: v >= low, f"{what} >= {low:g}")


def above(key: str, low: float) -> Rule:
    return Rule(key, lambda v: v > low, f"a number > {low:g}")


def within(key: str, low: float, high: float, low_open: bool = False) -> Rule:
    bracket = "(" if low_open else "["
    requirement = f"a number in {bracket}{low:g}, {high:g}]"
    return Rule(key, lambda v: (low < v if low_open else low <= v) and v <= high, requirement)


def one_of(key: str, names: Sequence[str]) -> Rule:
    return Rule(key, lambda v: v in names, "one of: " + ", ".join(names), names)


def optional(rule: Rule) -> Rule:
    return Rule(rule.key, lambda v: v is None or rule.ok(v), f"null or {rule.requirement}", rule.names)


def special_or_at_least_one(key: str, special: int, meaning: str) -> Rule:
    return Rule(key, lambda v: v == special or v >= 1, f"{special} ({meaning}) or an integer >= 1")


def interval(key: str) -> Rule:
    return Rule(key, lambda v: v >= 0, "an integer >= 0 (0 turns it off)")


_ALGO = "trainer.algorithm."
_OPT = "trainer.policy.optimizer_config."
_PLACE = "trainer.placement."
_OPC = "trainer.algorithm.off_policy_correction."

RULES: tuple[Rule, ...] = (
    one_of("trainer.kernels", choices.KERNELS),
    *(
        at_least(f"trainer.{name}", 1)
        for name in (
            "train_batch_size",
            "policy_mini_batch_size",
            "micro_train_batch_size_per_gpu",
            "micro_forward_batch_size_per_gpu",
            "epochs",
        )
    ),
    optional(at_least("trainer.max_steps", 1)),
    optional(at_least("trainer.max_tokens_per_micro_batch", 1)),
    optional(at_least("trainer.policy.fused_kernel_chunk_size", 1)),
    at_least("trainer.seed", 0),
    at_least("trainer.fully_async.max_staleness_steps", 0),
    at_least("trainer.fully_async.partial_rollout_tokens", 0),
    optional(above("trainer.actor_call_timeout_s", 0)),
    at_least("trainer.max_restarts", 0),
    at_least("trainer.restart_window_steps", 0),
    optional(above("trainer.collective_timeout_s", 0)),
    at_least(_ALGO + "zero_variance_filter_tol", 0, "a number"),
    *(interval(f"trainer.{name}") for name in ("ckpt_interval", "hf_save_interval", "eval_interval")),
    special_or_at_least_one("trainer.max_ckpts_to_keep", -1, "keep every checkpoint"),
    *(at_least(_OPT + name, 0, "a number") for name in ("lr", "weight_decay", "max_grad_norm")),
    at_least(_OPT + "lr_warmup_steps", 0),
    at_least("trainer.policy.sequence_parallel_size", 1),
    *(at_least(_PLACE + name, 1) for name in ("policy_num_nodes", "policy_num_gpus_per_node")),
    *(optional(at_least(_PLACE + name, 1)) for name in ("ref_num_nodes", "ref_num_gpus_per_node")),
    optional(above(_PLACE + "gpu_memory_gb", 0)),
    one_of(_ALGO + "advantage_estimator", choices.ADVANTAGE_ESTIMATORS),
    one_of(_ALGO + "policy_loss_type", choices.POLICY_LOSSES),
    one_of(_ALGO + "loss_reduction", choices.LOSS_REDUCTIONS),
    one_of(_ALGO + "kl_estimator_type", choices.KL_ESTIMATORS),
    *(
        at_least(_ALGO + name, 0, "a number")
        for name in ("eps_clip_low", "eps_clip_high", "kl_loss_coef", "entropy_loss_coef")
    ),
    above(_ALGO + "clip_ratio_c", 1),
    *(above(_ALGO + f"sapo.{name}", 0) for name in ("tau_pos", "tau_neg")),
    within(_ALGO + "clip_cov.clip_ratio", 0, 1, low_open=True),
    within(_ALGO + "kl_cov.kl_cov_frac", 0, 1, low_open=True),
    at_least(_ALGO + "kl_cov.ppo_kl_coef", 0, "a number"),
    one_of(_ALGO + "kl_ctrl.type", choices.KL_CONTROLLERS),
    above(_ALGO + "kl_ctrl.kl_target", 0),
    at_least(_ALGO + "kl_ctrl.horizon", 1),
    within(_ALGO + "gamma", 0, 1),
    within(_ALGO + "lambd", 0, 1),
    optional(one_of(_OPC + "tis_ratio_type", choices.TIS_RATIO_TYPES)),
    optional(one_of(_OPC + "sequence_mask_metric", choices.SEQUENCE_MASK_METRICS)),
    *(above(_OPC + name, 0) for name in ("token_tis_ratio_clip_high", "sequence_tis_ratio_clip_high",
                                         "geo_mask_high", "geo_mask_low", "product_mask_high", "product_mask_low")),
    *(optional(above(_OPC + f"{kind}_is_threshold_{side}", 0)) for kind in ("outlier_token", "token_mask")
      for side in ("low", "high")),
    optional(one_of(_ALGO + "dynamic_sampling.type", choices.DYNAMIC_SAMPLING_TYPES)),
    special_or_at_least_one(_ALGO + "dynamic_sampling.max_sample_batches", -1, "no bound"),
    within(_ALGO + "dynamic_sampling.min_replace_ratio", 0, 1, low_open=True),
    at_least(_ALGO + "overlong_buffer.len", 0, "an integer (0 turns it off)"),
    at_least(_ALGO + "overlong_buffer.penalty_factor", 0, "a number"),
    at_least("data.reward_num_workers", 0),
    at_least("generator.max_turns", 1),
    optional(above("environment.step_timeout_s", 0)),
    at_least("environment.max_env_workers", 1),
    optional(above("environment.agent_timeout_s", 0)),
    within("generator.http_endpoint_port", 0, 65535),
    *(rule for model in ("policy", "critic") for rule in (
        at_least(f"trainer.{model}.model.lora.rank", 0),
        above(f"trainer.{model}.model.lora.alpha", 0),
        Rule(f"trainer.{model}.model.lora.dropout", lambda v: 0 <= v < 1, "a number in [0, 1)"),
        one_of(f"trainer.{model}.model.lora.init_method", choices.LORA_INIT_METHODS))),
    at_least("trainer.reward.batch_size", 1),
    at_least("trainer.reward.judge.max_new_tokens", 1),
    one_of("trainer.reward.judge.backend", choices.GENERATOR_BACKENDS),
    optional(at_least("generator.max_input_length", 2)),
    optional(above("data.reward_timeout_s", 0)),
    one_of("data.reward_on_error", choices.REWARD_ON_ERROR),
    one_of("data.truncation", choices.TRUNCATION),
    one_of("trainer.non_finite", choices.NON_FINITE),
    one_of("generator.backend", choices.GENERATOR_BACKENDS),
    optional(one_of("generator.weight_sync_backend", choices.WEIGHT_SYNC_BACKENDS)),
    *(at_least(f"generator.{name}", 1) for name in ("num_inference_engines", "inference_engine_tensor_parallel_size",
                                                     "max_num_batched_tokens", "max_num_seqs",
                                                     "weight_sync_bucket_mb")),
    within("generator.gpu_memory_utilization", 0, 1, low_open=True),
    optional(at_least("generator.kv_cache_memory_bytes", 1, "a number of bytes")),
    *(
        at_least(f"generator.{name}", 1)
        for name in ("n_samples_per_prompt", "max_generate_length", "max_prompt_length", "eval_n_samples_per_prompt")
    ),
    above("generator.temperature", 0),
    Rule("generator.eval_temperature", lambda v: v >= 0, "a number >= 0 (0 = greedy decoding)"),
    within("generator.top_p", 0, 1, low_open=True),
    special_or_at_least_one("generator.top_k", -1, "off"),
    Rule("generator.stop", lambda v: v is None or all(isinstance(s, str) and s for s in v),
         "a list of non-empty strings, or null"),
)

NON_EMPTY_STRINGS = (
    "trainer.policy.model.path",
    "trainer.ckpt_path",
    "trainer.export_path",
    "trainer.project_name",
    "data.prompt_key",
    "data.answer_key",
    "trainer.ckpt_keep_metric",
)


def check_strategy_name(cfg: Config, problems: Problems) -> None:
    check_rules(cfg, problems, (one_of("trainer.strategy", strategies.STRATEGIES.names()),))


def check_rules(cfg: Config, problems: Problems, rules: Sequence[Rule] = RULES) -> None:
    """Every rule of `rules` (a strategy passes the rules of its own blocks)."""
    for rule in rules:
        value = get(cfg, rule.key)
        if (isinstance(value, float) and not math.isfinite(value)) or not rule.ok(value):
            hint = did_you_mean(value, rule.names) if isinstance(value, str) and rule.names else ""
            problems.add(rule.key, f"got {value!r}; set it to {rule.requirement}{hint}")


FUSED_KERNEL_POLICY_LOSSES = ("regular", "dual_clip", "cispo")
"""Policy losses with a kernel formula (rl/kernels/reference/policy_terms.py POLICY_CODES; a kernel test checks
that the two agree)."""


def check_fused_kernels(cfg: Config, problems: Problems) -> None:
    """`use_fused_kernels` needs a kernel formula of the policy loss."""
    policy = cfg.trainer.policy
    if not policy.use_fused_kernels:
        return
    loss = cfg.trainer.algorithm.policy_loss_type
    if loss not in FUSED_KERNEL_POLICY_LOSSES:
        problems.add("trainer.policy.use_fused_kernels", f"has no kernel formula for trainer.algorithm."
                     f"policy_loss_type={loss!r} (it has: {', '.join(FUSED_KERNEL_POLICY_LOSSES)}); set "
                     "use_fused_kernels=false for it")


def check_strings(cfg: Config, problems: Problems) -> None:
    for key in NON_EMPTY_STRINGS:
        value = get(cfg, key)
        if value is not None and not value.strip():
            problems.add(key, "is empty; set it to a non-empty string")
    if cfg.trainer.run_name is not None and not cfg.trainer.run_name.strip():
        problems.add("trainer.run_name", "is empty; set a name or null (derived from the time)")
    if cfg.trainer.ckpt_keep_metric is not None and cfg.trainer.max_ckpts_to_keep == -1:
        problems.add("trainer.ckpt_keep_metric", "ranks checkpoints for trainer.max_ckpts_to_keep, which keeps every "
                     "checkpoint (-1); set max_ckpts_to_keep to the number to keep, or remove it")


def check_lists(cfg: Config, problems: Problems) -> None:
    loggers = cfg.trainer.logger
    if not loggers:
        problems.add("trainer.logger", "is empty; name at least one of: " + ", ".join(choices.LOGGERS))
    for index, name in enumerate(loggers):
        if name not in choices.LOGGERS:
            valid = ", ".join(choices.LOGGERS)
            hint = did_you_mean(name, choices.LOGGERS)
            problems.add(f"trainer.logger[{index}]", f"unknown logger {name!r}; use any of: {valid}{hint}")
    if len(set(loggers)) != len(loggers):
        problems.add("trainer.logger", f"names a logger twice ({loggers}); list each once")
    betas = cfg.trainer.policy.optimizer_config.betas
    if len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
        problems.add(_OPT + "betas", f'got {betas}; set it to two numbers in [0, 1), e.g. "[0.9, 0.999]"')
    if not cfg.data.train_data:
        problems.add("data.train_data", "is empty; give at least one file, e.g. data.train_data=\"['a.parquet']\"")
    for key in ("data.train_data", "data.val_data"):
        for index, path in enumerate(get(cfg, key)):
            if not path.strip():
                problems.add(f"{key}[{index}]", "is an empty path; remove it or give a file")
    check_validation_split(cfg, problems)
    check_lr_schedules(cfg, problems)
    check_reward_lists(cfg, problems)


def check_lr_schedules(cfg: Config, problems: Problems) -> None:
    for block, opt in (("trainer.policy.optimizer_config.", cfg.trainer.policy.optimizer_config),
                       ("trainer.critic.optimizer_config.", cfg.trainer.critic.optimizer_config)):
        if opt.scheduler not in choices.LR_SCHEDULERS:
            problems.add(block + "scheduler", f"unknown scheduler {opt.scheduler!r}; use any of: "
                         f"{', '.join(choices.LR_SCHEDULERS)}{did_you_mean(opt.scheduler, choices.LR_SCHEDULERS)}")
        elif opt.scheduler == "constant":
            for name, off in (("min_lr", 0), ("lr_decay_steps", None)):
                if getattr(opt, name) != off:
                    problems.add(block + name, f"is {getattr(opt, name)}, but {block}scheduler=constant does not "
                                 "decay; set the scheduler to cosine or linear, or remove it")
        if not 0 <= opt.min_lr <= opt.lr:
            problems.add(block + "min_lr", f"is {opt.min_lr}; give a rate in [0, lr={opt.lr}]")
        if opt.lr_decay_steps is not None and opt.lr_decay_steps <= opt.lr_warmup_steps:
            problems.add(block + "lr_decay_steps", f"is {opt.lr_decay_steps}, not past the {opt.lr_warmup_steps} "
                         "warm-up steps; give a later step, or null for the run's last")


def check_validation_split(cfg: Config, problems: Problems) -> None:
    size = cfg.data.val_split_size
    if size < 0 or (size >= 1 and size != int(size)):
        problems.add("data.val_split_size", f"is {size}; give 0 (no split), a fraction in (0, 1) or a whole number "
                     "of rows")


def check_reward_lists(cfg: Config, problems: Problems) -> None:
    data = cfg.data
    if not data.reward_fn:
        problems.add("data.reward_fn", "is empty; name a reward, e.g. data.reward_fn=gsm8k")
    for index, name in enumerate(data.reward_fn):
        if not name.strip():
            problems.add(f"data.reward_fn[{index}]", "is empty; remove it or name a reward")
    weights = data.reward_weights
    if weights is not None:
        if len(weights) != len(data.reward_fn):
            problems.add("data.reward_weights", f"has {len(weights)} weight(s) for {len(data.reward_fn)} reward "
                         "function(s) in data.reward_fn; give one per function, or null for all 1")
        for index, weight in enumerate(weights):
            if not math.isfinite(weight):
                problems.add(f"data.reward_weights[{index}]", f"is {weight}; weights must be finite numbers")
    if data.reward_num_workers == 0 and data.reward_timeout_s is not None:
        problems.add("data.reward_timeout_s", "cannot be enforced with data.reward_num_workers=0 (rewards run in the "
                     "driver); set data.reward_num_workers >= 1, or data.reward_timeout_s=null")


def check_prompt_files(cfg: Config, problems: Problems) -> None:
    """The prompt template and system prompt files read, and the template has its one `{}` (before any data or
    model is loaded)."""
    for key, path, template in ((TEMPLATE_KEY, cfg.data.prompt_template_file, True),
                                (SYSTEM_KEY, cfg.data.system_prompt_file, False)):
        problem = prompt_file_problem(path, template)
        if problem:
            problems.add(key, problem)


def check_resume_mode(cfg: Config, problems: Problems) -> None:
    mode = cfg.trainer.resume_mode
    if mode in choices.RESUME_MODES or os.path.isdir(mode):
        return
    problems.add(
        "trainer.resume_mode",
        f"{mode!r} is neither {' nor '.join(choices.RESUME_MODES)} nor an existing "
        f"checkpoint directory{did_you_mean(mode, choices.RESUME_MODES)}; fix the "
        "path or use none / latest",
    )
