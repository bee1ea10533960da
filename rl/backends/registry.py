"""The training strategies by name. Each entry names its backend class, imported only when a worker builds one, so
the launcher and the config loader can list and check strategies without importing torch's or megatron's stacks.

Adding a strategy is one module implementing `rl.backends.base.TrainingBackend` and one `register` call here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rl.core.registry import Registry

if TYPE_CHECKING:
    from rl.backends.base import ModelSpec, TrainingBackend
    from rl.backends.dist import DistInfo


@dataclass(frozen=True)
class Strategy:
    """One registry entry: where its backend class lives (`package.module:Class`)."""

    backend: str

    def backend_class(self) -> type[TrainingBackend]:
        module, _, name = self.backend.partition(":")
        return getattr(importlib.import_module(module), name)


STRATEGIES: Registry[Strategy] = Registry("trainer.strategy")
STRATEGIES.register("fsdp")(Strategy("rl.backends.fsdp:FSDPBackend"))
STRATEGIES.register("fsdp2")(Strategy("rl.backends.fsdp2:FSDP2Backend"))
STRATEGIES.register("deepspeed")(Strategy("rl.backends.deepspeed:DeepSpeedBackend"))
STRATEGIES.register("megatron")(Strategy("rl.backends.megatron.backend:MegatronBackend"))


def build_backend(strategy: str, spec: ModelSpec, dist_info: DistInfo) -> TrainingBackend:
    backend = STRATEGIES.get(strategy).backend_class()(spec, dist_info)
    backend.build()
    return backend
