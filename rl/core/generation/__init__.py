"""Generation engines: `build_engine(name, model, tokenizer)` -> a `GenerationEngine` producing `Rollout`s."""

from rl.core.generation.engine import (
    GENERATION_ENGINES,
    FinishReason,
    GenerationEngine,
    Rollout,
    SamplingParams,
    build_engine,
)
from rl.core.generation.hf_engine import HFGenerationEngine

__all__ = [
    "GENERATION_ENGINES",
    "FinishReason",
    "GenerationEngine",
    "HFGenerationEngine",
    "Rollout",
    "SamplingParams",
    "build_engine",
]
