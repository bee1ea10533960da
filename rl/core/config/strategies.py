"""The training strategies as the config layer sees them.

Each strategy is declared next to its backend in `rl/backends` and registered in `STRATEGIES` when
`rl.backends.registry` is imported (the launcher does; so must any program that loads a config). A strategy names
its own config blocks (typed dataclasses whose field defaults and docstrings are the blocks' defaults and reference
documentation, at dotted keys such as `trainer.policy.megatron_config`), checks them, says how many ranks share one
data shard, which NeMo RL keys select and configure it, and what its backend receives. The loader, the checks and
the NeMo key mapping read only this registry, so nothing in `rl/core` names a strategy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from rl.core.config.errors import Problems
from rl.core.registry import Registry

if TYPE_CHECKING:
    from rl.core.config.schema import Config


class StrategyConfig:
    """What one strategy tells the config layer. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    backend: ClassVar[str]
    """`package.module:Class` of its `rl.backends.base.TrainingBackend`, imported on the workers only."""
    blocks: ClassVar[Mapping[str, type]] = {}
    """Dotted key -> block dataclass, for each config block the strategy owns (two strategies may share one)."""
    nemo_flags: ClassVar[tuple[str, ...]] = ()
    """NeMo RL keys whose `true` selects this strategy (`policy.megatron_cfg.enabled`)."""
    nemo_priority: ClassVar[int] = 0
    """When several strategies' NeMo flags are true, the highest priority wins (with a warning)."""
    nemo_keys: ClassVar[Mapping[str, str]] = {}
    """NeMo RL key -> the key it sets here."""
    lora: ClassVar[bool] = False
    """Whether its backend trains LoRA adapters (`trainer.policy.model.lora`)."""
    ulysses: ClassVar[bool] = False
    """Whether its backend runs Ulysses sequence parallelism (`trainer.policy.sequence_parallel_size` > 1)."""
    ulysses_hint: ClassVar[str] = ""
    """What to set instead of `trainer.policy.sequence_parallel_size` > 1 where it does not."""
    images: ClassVar[bool] = False
    """Whether its backend trains a vision-language model on images (`rl.backends.multimodal`)."""
    own_attention: ClassVar[str] = ""
    """Where its backend computes attention with kernels of its own instead of the Hugging Face model's
    implementations (so `trainer.flash_attn=true` cannot apply); empty for Hugging Face attention."""

    def check(self, cfg: Config, problems: Problems) -> None:
        """Problems of this strategy's blocks and of options it does not implement, each naming its key."""

    def model_parallel_size(self, cfg: Config, role: str = "policy") -> tuple[int, str]:
        """(ranks that share one data shard, how that number came about) for the workers of `role` ("policy" or
        "critic")."""
        size = getattr(cfg.trainer, role).sequence_parallel_size
        return size, f"trainer.{role}.sequence_parallel_size {size}"

    def backend_options(self, cfg: Config, role: str) -> dict[str, Any]:
        """The strategy's own settings for one model ("policy", "ref" or "critic"), as `ModelSpec.backend_options`."""
        return {}


STRATEGIES: Registry[StrategyConfig] = Registry("trainer.strategy")
AUTO = "auto"
"""`trainer.strategy=auto`: the memory planner picks a registered strategy and its layout (rl.backends.planner.auto)."""


def register(strategy: StrategyConfig) -> StrategyConfig:
    """Adds a strategy; a block key it shares with another strategy must have the same type there."""
    for key, block in strategy.blocks.items():
        missing = [f.name for f in dataclasses.fields(block)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise TypeError(f"strategy {strategy.name}: block {key} ({block.__name__}) has no default for {missing}")
        other = block_types().get(key)
        if other is not None and other is not block:
            raise TypeError(f"strategy {strategy.name}: block {key} is {block.__name__} here but {other.__name__} "
                            "in another strategy")
    STRATEGIES.register(strategy.name)(strategy)
    return strategy


def unregister(name: str) -> None:
    """Removes a strategy (for tests that register one of their own)."""
    STRATEGIES.remove(name)


def selected(cfg: Config) -> StrategyConfig | None:
    """The strategy `trainer.strategy` names, or None when it names none (its check reports that)."""
    return STRATEGIES.get(cfg.trainer.strategy) if cfg.trainer.strategy in STRATEGIES else None


def block_types() -> dict[str, type]:
    """Every registered block: dotted key -> dataclass."""
    return {key: block for name in STRATEGIES for key, block in STRATEGIES.get(name).blocks.items()}


def owners(key: str) -> list[str]:
    """The strategies that own the block at `key`."""
    return [name for name in STRATEGIES if key in STRATEGIES.get(name).blocks]


def block_at(key: str) -> tuple[str, type] | None:
    """(block key, block type) of the block that holds dotted `key` (the block itself or a key inside it)."""
    for block_key, block in block_types().items():
        if key == block_key or key.startswith(block_key + "."):
            return block_key, block
    return None


def block_defaults(block: type) -> dict[str, Any]:
    """A block's defaults as a plain mapping."""
    return dataclasses.asdict(block())


def require_strategies() -> None:
    """Loading a config needs the strategies: say how to register them instead of refusing every strategy."""
    if not STRATEGIES.names():
        raise RuntimeError("no training strategy is registered: import rl.backends.registry before loading a config")


def local_model_config(path: str):
    """The config.json of a local model directory as attributes, or None (a hub name, the embedded model), for
    checks of a model's shape against a strategy's sizes before anything loads."""
    file = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            return types.SimpleNamespace(**json.load(f))
    except (OSError, ValueError):
        return None  # the model loader reports an unreadable config
