"""NeMo RL spellings of config keys, translated to this project's keys.

`policy.megatron_cfg.enabled=true` selects strategy `megatron`; `policy.dtensor_cfg.enabled=true` (or
`policy.dtensor_config.enabled`) selects `fsdp2`; with both enabled `megatron` wins and a warning is logged. Other
supported keys map one to one (KEY_MAP). Within one layer (a file or the override list) the translated strategy
takes the place of the first enabled flag, so later keys of that layer still win; in a file, NeMo RL sections are
applied after the native ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from rl.core.config.errors import Problems, did_you_mean
from rl.core.config.merge import flatten
from rl.core.config.yaml_io import parse_text

_MEGATRON = "trainer.policy.megatron_config."
_OPTIMIZER = "trainer.policy.optimizer_config."
_ALGORITHM = "trainer.algorithm."
_DTENSOR = {
    "cpu_offload": "trainer.policy.fsdp_config.cpu_offload",
    "activation_checkpointing": "trainer.gradient_checkpointing",
}

KEY_MAP: dict[str, str] = {
    "policy.model_name": "trainer.policy.model.path",
    "policy.train_micro_batch_size": "trainer.micro_train_batch_size_per_gpu",
    "policy.logprob_batch_size": "trainer.micro_forward_batch_size_per_gpu",
    "policy.max_grad_norm": _OPTIMIZER + "max_grad_norm",
    "policy.optimizer.kwargs.lr": _OPTIMIZER + "lr",
    "policy.optimizer.kwargs.weight_decay": _OPTIMIZER + "weight_decay",
    "policy.optimizer.kwargs.betas": _OPTIMIZER + "betas",
    "policy.megatron_cfg.tensor_model_parallel_size": _MEGATRON + "tensor_model_parallel_size",
    "policy.megatron_cfg.pipeline_model_parallel_size": _MEGATRON + "pipeline_model_parallel_size",
    "policy.megatron_cfg.expert_model_parallel_size": _MEGATRON + "expert_model_parallel_size",
    "policy.megatron_cfg.sequence_parallel": _MEGATRON + "sequence_parallel",
    "policy.megatron_cfg.optimizer.optimizer_cpu_offload": _MEGATRON + "optimizer_cpu_offload",
    **{f"policy.dtensor_cfg.{name}": target for name, target in _DTENSOR.items()},
    **{f"policy.dtensor_config.{name}": target for name, target in _DTENSOR.items()},
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
    "loss_fn.reference_policy_kl_penalty": _ALGORITHM + "kl_loss_coef",
    "loss_fn.ratio_clip_min": _ALGORITHM + "eps_clip_low",
    "loss_fn.ratio_clip_max": _ALGORITHM + "eps_clip_high",
    "loss_fn.ratio_clip_c": _ALGORITHM + "clip_ratio_c",
    "checkpointing.checkpoint_dir": "trainer.ckpt_path",
    "checkpointing.save_period": "trainer.ckpt_interval",
}
"""NeMo RL key -> this project's key, for keys whose values mean the same in both."""

STRATEGY_FLAGS: dict[str, str] = {
    "policy.megatron_cfg.enabled": "megatron",
    "policy.dtensor_cfg.enabled": "fsdp2",
    "policy.dtensor_config.enabled": "fsdp2",
}
"""NeMo RL backend switch -> the strategy it selects when true."""

STRATEGY_PRECEDENCE = ("megatron", "fsdp2")
"""When several switches are on, the first of these that is enabled wins."""

NAMESPACES = frozenset(key.split(".")[0] for key in (*KEY_MAP, *STRATEGY_FLAGS))


def is_nemo_key(key: str) -> bool:
    return key.split(".")[0] in NAMESPACES


def translate(items: Sequence[tuple[str, Any]], problems: Problems) -> list[tuple[str, Any]]:
    """Items with NeMo RL keys replaced by this project's keys; other keys pass through unchanged.

    Values may be parsed YAML (from a file) or override text; only the strategy switches are read here.
    """
    enabled = [key for key, value in items if key in STRATEGY_FLAGS and _flag(key, value, problems)]
    strategy = _choose_strategy(enabled, problems)
    translated: list[tuple[str, Any]] = []
    for key, value in items:
        if key in STRATEGY_FLAGS:
            if enabled and key == enabled[0]:
                translated.append(("trainer.strategy", strategy))
        elif key in KEY_MAP:
            translated.append((KEY_MAP[key], value))
        elif is_nemo_key(key):
            supported = [*KEY_MAP, *STRATEGY_FLAGS]
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


def _flag(key: str, value: Any, problems: Problems) -> bool:
    try:
        parsed = parse_text(value) if isinstance(value, str) else value
    except yaml.YAMLError:
        parsed = value
    if isinstance(parsed, bool):
        return parsed
    problems.add(key, f"expected true or false, got {value!r}; true selects trainer.strategy={STRATEGY_FLAGS[key]}")
    return False


def _choose_strategy(enabled: list[str], problems: Problems) -> str | None:
    strategies = {STRATEGY_FLAGS[key] for key in enabled}
    if not strategies:
        return None
    chosen = next(name for name in STRATEGY_PRECEDENCE if name in strategies)
    if len(strategies) > 1:
        problems.warn(f"both {' and '.join(sorted(set(enabled)))} are enabled; using trainer.strategy={chosen}")
    return chosen
