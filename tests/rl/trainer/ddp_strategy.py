"""A strategy that exists only for tests: torch's DistributedDataParallel around the Hugging Face model, with a
config block of its own. It shows what adding a backend takes: one module (a backend and its StrategyConfig), one
registry entry (`register(DDPStrategy())`, done by the test that uses it) and one config block."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from rl.backends.base import TrainingBackend
from rl.backends.hf_model import load_causal_lm
from rl.core.config.strategies import StrategyConfig

BLOCK = "trainer.policy.ddp_config"


@dataclass(kw_only=True)
class DDPConfig:
    """Knobs of the test-only `ddp` strategy."""

    bucket_cap_mb: int = 25
    """Size of DDP's gradient all-reduce buckets."""

    gradient_as_bucket_view: bool = False
    """Let gradients alias the all-reduce buckets (saves one copy)."""


class DDPStrategy(StrategyConfig):
    name = "ddp"
    backend = "tests.rl.trainer.ddp_strategy:DDPBackend"
    blocks: ClassVar[dict[str, type]] = {BLOCK: DDPConfig}

    def check(self, cfg, problems) -> None:
        if cfg.blocks[BLOCK].bucket_cap_mb < 1:
            problems.add(f"{BLOCK}.bucket_cap_mb", "must be >= 1")

    def backend_options(self, cfg, role: str) -> dict:
        return dataclasses.asdict(cfg.blocks[BLOCK])


class DDPBackend(TrainingBackend):
    def build(self) -> None:
        options = DDPConfig(**(self.spec.backend_options or {}))
        model = load_causal_lm(self.spec.path, self.dist.device)
        if not self.trainable:
            self.model = model.requires_grad_(False)
            return
        self.model = DistributedDataParallel(model, bucket_cap_mb=options.bucket_cap_mb,
                                             gradient_as_bucket_view=options.gradient_as_bucket_view)
        self.make_optimizer(self.model.parameters())

    def _module(self) -> torch.nn.Module:
        return self.model.module if isinstance(self.model, DistributedDataParallel) else self.model

    def save_checkpoint(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        torch.save({"model": self._module().state_dict(), "optimizer": self.optimizer.state_dict()},
                   os.path.join(path, f"rank{self.dist.rank}.pt"))

    def load_checkpoint(self, path: str) -> None:
        state = torch.load(os.path.join(path, f"rank{self.dist.rank}.pt"))
        self._module().load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    @classmethod
    def checkpoint_weights(cls, path: str, model_path: str) -> dict[str, Tensor]:
        return torch.load(os.path.join(path, "rank0.pt"), weights_only=True)["model"]

    def full_state_dict(self) -> dict[str, Tensor]:
        if not self.dist.is_main:
            return {}
        return {name: tensor.detach().clone() for name, tensor in self._module().state_dict().items()}
