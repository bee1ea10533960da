"""Strategy `deepspeed` as the config layer sees them: the `deepspeed_config` block, passed through to DeepSpeed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from rl.core.config.strategies import StrategyConfig

BLOCK = "deepspeed_config"


@dataclass(kw_only=True)
class DeepSpeedConfig:
    """DeepSpeed configuration dictionaries, passed through to DeepSpeed (strategy `deepspeed` only). Empty by
    default; the deepspeed backend fills what is not given from its own defaults (deepspeed_defaults.yaml)."""

    train: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed config of the trained policy (ZeRO stage, offload, ...); merged over the backend's defaults."""

    eval: dict[str, Any] = field(default_factory=dict)
    """DeepSpeed config of models used only for inference (the reference model)."""


class DeepSpeedStrategy(StrategyConfig):
    name = "deepspeed"
    backend = "rl.backends.deepspeed:DeepSpeedBackend"
    blocks: ClassVar[dict[str, type]] = {BLOCK: DeepSpeedConfig}

    def backend_options(self, cfg, role: str) -> dict:
        block = cfg.blocks[BLOCK]
        return dict(block.train if role == "policy" else block.eval)
