"""What the bf16 tests share: the strategies they run (and the packages each needs) and the torch optimizers a
backend's updates land in. Their model is `backend_steps.write_small_qwen`'s."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rl.core.algorithms import LossSettings
from tests.testing import tolerances

STRATEGIES = ["fsdp2", "fsdp", "deepspeed", "megatron"]
NEEDS = {"deepspeed": "deepspeed", "megatron": "megatron.core"}
SETTINGS = LossSettings(use_kl_loss=False)


def need(strategy: str) -> None:
    if strategy in NEEDS:
        pytest.importorskip(NEEDS[strategy])


def available() -> list[str]:
    return [s for s in STRATEGIES if s not in NEEDS or importlib.util.find_spec(NEEDS[s].split(".")[0])]


def torch_optimizers(backend) -> list[torch.optim.Optimizer]:
    """The torch optimizers whose parameters are the weights the updates land in (DeepSpeed's and megatron's hold
    their float32 master copies)."""
    if hasattr(backend, "engine"):
        return [backend.engine.optimizer.optimizer]
    if hasattr(backend.optimizer, "torch_optimizers"):
        return backend.optimizer.torch_optimizers()
    return [backend.optimizer]


def roundoff(dtype: torch.dtype) -> float:
    """The unit roundoff of a floating dtype; 0 for an integer one (its values are exact)."""
    return tolerances.unit_roundoff(dtype) if dtype.is_floating_point else 0.0
