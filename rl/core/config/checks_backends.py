"""Checks that each backend's knobs are set only when that backend runs, and that they work with it.

A knob set for a backend that is not selected would silently do nothing, so it is an error: a non-default
`megatron_config` value needs strategy megatron; a non-default `fsdp_config` value (policy or ref) needs fsdp or
fsdp2; a non-empty `deepspeed_config.train` / `.eval` needs deepspeed; `sequence_parallel_size > 1` is not for
megatron.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rl.core.config.defaults import default_value
from rl.core.config.errors import Problems
from rl.core.config.schema import Config

_INSTEAD = {
    "fsdp": "the fsdp_config blocks",
    "fsdp2": "the fsdp_config blocks",
    "deepspeed": "deepspeed_config.train / deepspeed_config.eval",
    "megatron": "trainer.policy.megatron_config",
}
"""Where each strategy keeps its knobs, for the hint of a misplaced knob."""


def _changed(block: Any, key: str) -> dict[str, Any]:
    """Fields of a config block whose value differs from defaults.yaml."""
    defaults = default_value(key)
    return {
        f.name: getattr(block, f.name) for f in dataclasses.fields(block) if getattr(block, f.name) != defaults[f.name]
    }


def _misplaced(problems: Problems, key: str, value: Any, owners: str, strategy: str) -> None:
    problems.add(
        key,
        f"is set to {value!r}, which only applies to trainer.strategy={owners}, but trainer.strategy is "
        f"{strategy}, where it would do nothing; remove it (the {strategy} knobs are in "
        f"{_INSTEAD.get(strategy, 'its own block')}) or set trainer.strategy={owners}",
    )


def check_backend_blocks(cfg: Config, problems: Problems) -> None:
    strategy = cfg.trainer.strategy
    if strategy != "megatron":
        key = "trainer.policy.megatron_config"
        for name, value in _changed(cfg.trainer.policy.megatron_config, key).items():
            _misplaced(problems, f"{key}.{name}", value, "megatron", strategy)
    if strategy in ("megatron", "deepspeed"):
        for model in ("policy", "ref"):
            key = f"trainer.{model}.fsdp_config"
            for name, value in _changed(getattr(cfg.trainer, model).fsdp_config, key).items():
                _misplaced(problems, f"{key}.{name}", value, "fsdp or fsdp2", strategy)
    if strategy != "deepspeed":
        for name in ("train", "eval"):
            if getattr(cfg.deepspeed_config, name):
                _misplaced(
                    problems, f"deepspeed_config.{name}", getattr(cfg.deepspeed_config, name), "deepspeed", strategy
                )
    if strategy == "megatron" and cfg.trainer.policy.sequence_parallel_size != 1:
        problems.add(
            "trainer.policy.sequence_parallel_size",
            "must be 1 with trainer.strategy=megatron (Ulysses sequence parallelism is for fsdp, fsdp2 and "
            "deepspeed); use trainer.policy.megatron_config.sequence_parallel=true with TP > 1 instead",
        )


def check_fsdp1_offload(cfg: Config, problems: Problems) -> None:
    """FSDP1 cannot accumulate gradients outside `no_sync` with CPU offload, so the policy cannot offload there."""
    if cfg.trainer.strategy == "fsdp" and cfg.trainer.policy.fsdp_config.cpu_offload:
        problems.add(
            "trainer.policy.fsdp_config.cpu_offload",
            "cannot be true with trainer.strategy=fsdp: FSDP1 cannot accumulate gradients outside no_sync "
            "with CPU offload. Use trainer.strategy=fsdp2, or offload only the reference model "
            "(trainer.ref.fsdp_config.cpu_offload=true)",
        )
