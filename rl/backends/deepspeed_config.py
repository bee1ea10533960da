"""Strategy `deepspeed` as the config layer sees it: the `deepspeed_config` block, passed through to DeepSpeed and
checked at load time by DeepSpeed's own ZeRO config model (merged over the backend's deepspeed_defaults.yaml, as the
backend merges it), with a hint for a misspelt top-level key and a warning for ZeRO-3 knobs under a lower stage."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml

from rl.core.config.errors import Problems
from rl.core.config.merge import merge_free
from rl.core.config.strategies import StrategyConfig

BLOCK = "deepspeed_config"
DEFAULTS_FILE = os.path.join(os.path.dirname(__file__), "deepspeed_defaults.yaml")
ZERO3_ONLY = ("offload_param", "sub_group_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
              "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
              "stage3_gather_16bit_weights_on_model_save")
"""ZeRO knobs that only stage 3 reads (parameter partitioning)."""


@dataclass(kw_only=True)
class DeepSpeedConfig:
    """DeepSpeed configuration dictionaries, passed through to DeepSpeed (strategy `deepspeed` only). Empty by
    default; the deepspeed backend fills what is not given from its own defaults (deepspeed_defaults.yaml)."""

    train: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed config of the trained policy (ZeRO stage, offload, ...); merged over the backend's defaults."""

    eval: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed config of models used only for inference (the reference model)."""


def merged_section(section: str, user: dict) -> dict:
    """The backend's defaults of `section` ("train" / "eval") with the user's dict deep-merged over them: what the
    backend hands DeepSpeed."""
    merged = section_defaults(section)
    merge_free(merged, user or {})
    return merged


def section_defaults(section: str) -> dict:
    with open(DEFAULTS_FILE) as f:
        return yaml.safe_load(f)[section]


def _known_top_level_keys() -> set[str]:
    """The key names DeepSpeed's own constants spell (for a did-you-mean on near misses only)."""
    import deepspeed.runtime.constants as constants

    return {value for name, value in vars(constants).items() if name.isupper() and isinstance(value, str)
            and value.isidentifier()} | {"zero_optimization", "activation_checkpointing", "flops_profiler"}


def section_problems(key: str, given: dict, merged: dict, problems: Problems) -> None:
    """One section (`deepspeed_config.train` / `.eval`) against DeepSpeed's ZeRO config model."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from pydantic import ValidationError

    known = _known_top_level_keys()
    for name in sorted(set(given) - known):
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        if close:
            problems.add(f"{key}.{name}", f"is not a DeepSpeed config key (did you mean '{close[0]}'?); DeepSpeed "
                         "would ignore it")
    zero = merged.get("zero_optimization", {})
    try:
        stage = DeepSpeedZeroConfig(**zero).stage
    except ValidationError as error:
        for item in error.errors():
            where = ".".join(str(part) for part in item["loc"])
            problems.add(f"{key}.zero_optimization.{where}",
                         f"DeepSpeed refuses it: {item['msg']} (got {item.get('input')!r})")
        return
    for knob in sorted(set(given.get("zero_optimization", {})) & set(ZERO3_ONLY)):
        if int(stage) < 3:
            problems.warn(f"{key}.zero_optimization.{knob} does nothing at {key}.zero_optimization.stage="
                          f"{int(stage)}: only ZeRO stage 3 reads it")


class DeepSpeedStrategy(StrategyConfig):
    name = "deepspeed"
    backend = "rl.backends.deepspeed:DeepSpeedBackend"
    lora = True
    images = True
    blocks: ClassVar[dict[str, type]] = {BLOCK: DeepSpeedConfig}

    def check(self, cfg, problems: Problems) -> None:
        block = cfg.blocks[BLOCK]
        for section in ("train", "eval"):
            given = getattr(block, section)
            if given:  # the defaults alone are known to be valid: no DeepSpeed import for them
                section_problems(f"{BLOCK}.{section}", given, merged_section(section, given), problems)

    def backend_options(self, cfg, role: str) -> dict:
        block = cfg.blocks[BLOCK]
        return dict(block.eval if role == "ref" else block.train)  # the critic trains with the policy's settings
