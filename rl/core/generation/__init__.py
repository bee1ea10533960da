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
from rl.core.generation.vllm_engine import VLLMGenerationEngine  # imports vllm only when an engine is built

__all__ = [
    "GENERATION_ENGINES",
    "FinishReason",
    "GenerationEngine",
    "HFGenerationEngine",
    "Rollout",
    "SamplingParams",
    "VLLMGenerationEngine",
    "build_engine",
]
