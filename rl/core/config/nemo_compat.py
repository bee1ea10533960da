"""NeMo RL spellings of config keys, translated to this project's keys.

The strategies declare their own NeMo RL keys (`rl.core.config.strategies`): the switches that select them (e.g.
`policy.megatron_cfg.enabled=true`; with several enabled, the strategy of highest `nemo_priority` wins and a warning
is logged) and their block keys. Other supported keys map one to one (KEY_MAP). Within one layer (a file or the
override list) the translated strategy takes the place of the first enabled flag, so later keys of that layer still
win; in a file, NeMo RL sections are applied after the native ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from rl.core.config import strategies
from rl.core.config.errors import Problems, did_you_mean
from rl.core.config.merge import flatten
from rl.core.config.yaml_io import parse_text

_OPTIMIZER = "trainer.policy.optimizer_config."
_ALGORITHM = "trainer.algorithm."

KEY_MAP: dict[str, str] = {
    "policy.model_name": "trainer.policy.model.path",
    "policy.train_micro_batch_size": "trainer.micro_train_batch_size_per_gpu",
    "policy.logprob_batch_size": "trainer.micro_forward_batch_size_per_gpu",
    "policy.max_grad_norm": _OPTIMIZER + "max_grad_norm",
    "policy.optimizer.kwargs.lr": _OPTIMIZER + "lr",
    "policy.optimizer.kwargs.weight_decay": _OPTIMIZER + "weight_decay",
    "policy.optimizer.kwargs.betas": _OPTIMIZER + "betas",
    "policy.generation.backend": "generator.backend",
    "policy.generation.temperature": "generator.temperature",
    "policy.generation.top_p": "generator.top_p",
    "policy.generation.top_k": "generator.top_k",
    "policy.generation.max_new_tokens": "generator.max_generate_length",
    "grpo.num_generations_per_prompt": "generator.n_samples_per_prompt",
    "grpo.num_prompts_per_step": "trainer.train_batch_size",
    "grpo.max_num_steps": "trainer.max_steps",
    "grpo.max_num_epochs": "trainer.epochs",
    "grpo.val_period": "trainer.eval_interval",
    "grpo.val_at_start": "trainer.eval_before_train",
    "grpo.normalize_rewards": _ALGORITHM + "grpo_norm_by_std",
    "grpo.seed": "trainer.seed",
    "grpo.async_grpo.enabled": "trainer.fully_async.enabled",
    "grpo.async_grpo.max_trajectory_age_steps": "trainer.fully_async.max_staleness_steps",
    "loss_fn.reference_policy_kl_penalty": _ALGORITHM + "kl_loss_coef",
    "loss_fn.ratio_clip_min": _ALGORITHM + "eps_clip_low",
    "loss_fn.ratio_clip_max": _ALGORITHM + "eps_clip_high",
    "loss_fn.ratio_clip_c": _ALGORITHM + "clip_ratio_c",
    "checkpointing.checkpoint_dir": "trainer.ckpt_path",
    "checkpointing.save_period": "trainer.ckpt_interval",
    "cluster.gpus_per_node": "trainer.placement.policy_num_gpus_per_node",
    "cluster.num_nodes": "trainer.placement.policy_num_nodes",
}
"""NeMo RL key -> this project's key, for keys whose values mean the same in both (the strategies add theirs)."""


NO_EQUIVALENT: dict[str, str] = {
    "policy.max_seq_length": "generator.max_prompt_length and generator.max_generate_length (their sum bounds a "
                             "sequence)",
    "policy.max_total_sequence_length": "generator.max_prompt_length and generator.max_generate_length (their sum "
                                        "bounds a sequence)",
    "algorithm.batch_size": "trainer.train_batch_size (prompts per step) and trainer.policy_mini_batch_size (prompts "
                            "per optimizer step)",
    "algorithm.gradient_accumulation_steps": "trainer.micro_train_batch_size_per_gpu: accumulation follows from "
                                             "policy_mini_batch_size * n_samples_per_prompt / (micro batch * DP)",
}
"""NeMo RL keys whose meaning has no one-to-one key here -> what to set instead."""


def key_map() -> dict[str, str]:
    """KEY_MAP with every registered strategy's NeMo RL keys."""
    found = dict(KEY_MAP)
    for name in strategies.STRATEGIES:
        found.update(strategies.STRATEGIES.get(name).nemo_keys)
    return found


def strategy_flags() -> dict[str, str]:
    """NeMo RL backend switch -> the strategy it selects when true."""
    return {flag: name for name in strategies.STRATEGIES for flag in strategies.STRATEGIES.get(name).nemo_flags}


def is_nemo_key(key: str) -> bool:
    namespaces = {known.split(".")[0] for known in (*key_map(), *strategy_flags(), *NO_EQUIVALENT)}
    return key.split(".")[0] in namespaces


def translate(items: Sequence[tuple[str, Any]], problems: Problems) -> list[tuple[str, Any]]:
    """Items with NeMo RL keys replaced by this project's keys; other keys pass through unchanged.

    Values may be parsed YAML (from a file) or override text; only the strategy switches are read here.
    """
    flags, mapping = strategy_flags(), key_map()
    enabled = [key for key, value in items if key in flags and _flag(key, value, flags, problems)]
    strategy = _choose_strategy(enabled, flags, problems)
    translated: list[tuple[str, Any]] = []
    for key, value in items:
        if key in flags:
            if enabled and key == enabled[0]:
                translated.append(("trainer.strategy", strategy))
        elif key in mapping:
            translated.append((mapping[key], value))
        elif key in NO_EQUIVALENT:
            problems.add(key, f"NeMo RL key with no one-to-one equivalent here; set {NO_EQUIVALENT[key]}")
        elif is_nemo_key(key):
            supported = [*mapping, *flags]
            problems.add(
                key,
                f"NeMo RL key not supported{did_you_mean(key, supported)}; use the matching key of this "
                "project (rl/core/config/nemo_compat.py lists the NeMo RL keys it reads)",
            )
        else:
            translated.append((key, value))
    return translated


def split_file(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """A config file's (native sections, flattened NeMo RL items)."""
    native = {name: value for name, value in data.items() if not is_nemo_key(str(name))}
    nemo = {name: value for name, value in data.items() if is_nemo_key(str(name))}
    return native, flatten(nemo)


def _flag(key: str, value: Any, flags: dict[str, str], problems: Problems) -> bool:
    try:
        parsed = parse_text(value) if isinstance(value, str) else value
    except yaml.YAMLError:
        parsed = value
    if isinstance(parsed, bool):
        return parsed
    problems.add(key, f"expected true or false, got {value!r}; true selects trainer.strategy={flags[key]}")
    return False


def _choose_strategy(enabled: list[str], flags: dict[str, str], problems: Problems) -> str | None:
    names = {flags[key] for key in enabled}
    if not names:
        return None
    chosen = max(sorted(names), key=lambda name: strategies.STRATEGIES.get(name).nemo_priority)
    if len(names) > 1:
        problems.warn(f"both {' and '.join(sorted(set(enabled)))} are enabled; using trainer.strategy={chosen}")
    return chosen
