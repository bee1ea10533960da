"""What the bf16 tests share: the strategies they run (and the packages each needs), the tiny Qwen2 they run it on,
and the torch optimizers a backend's updates land in."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rl.core.algorithms import LossSettings
from tests.testing import tolerances

STRATEGIES = ["fsdp2", "fsdp", "deepspeed", "megatron"]
NEEDS = {"deepspeed": "deepspeed", "megatron": "megatron.core"}
SETTINGS = LossSettings(use_kl_loss=False)


def write_model(path: str) -> str:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


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
