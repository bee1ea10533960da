"""The training strategies by name. Each entry (`rl.core.config.strategies.StrategyConfig`) declares its config
blocks, checks and parallel sizes next to its backend, and names its backend class, which is imported only when a
worker builds one: the launcher and the config loader list and check strategies without importing torch's or
megatron's stacks.

Adding a strategy is one module implementing `rl.backends.base.TrainingBackend`, one `StrategyConfig` with its
config block, and one entry in `BUILT_IN` (or a `register` call of its own).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from rl.backends.deepspeed_config import DeepSpeedStrategy
from rl.backends.fsdp_config import FSDP2Strategy, FSDPStrategy
from rl.backends.megatron.config import MegatronStrategy
from rl.core.config.strategies import STRATEGIES, register

if TYPE_CHECKING:
    from rl.backends.base import ModelSpec, TrainingBackend
    from rl.backends.dist import DistInfo

BUILT_IN = (FSDP2Strategy(), FSDPStrategy(), DeepSpeedStrategy(), MegatronStrategy())
for _strategy in BUILT_IN:
    if _strategy.name not in STRATEGIES:
        register(_strategy)


def backend_class(backend: str) -> type[TrainingBackend]:
    """The class a strategy name or a `package.module:Class` path names."""
    path = backend if ":" in backend else STRATEGIES.get(backend).backend
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def build_backend(backend: str, spec: ModelSpec, dist_info: DistInfo) -> TrainingBackend:
    """A built backend of a strategy (by name, or by its backend's `package.module:Class` path)."""
    built = backend_class(backend)(spec, dist_info)
    built.build()
    return built
