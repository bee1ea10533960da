"""config.json values of published models, typed in (no download), for the memory planner's tests, with the
parameter totals their model cards give; and a helper that writes one into a model directory (config.json only)."""

from __future__ import annotations

import json
import os

QWEN25_05B = {
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}
QWEN25_7B = {
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}
MIXTRAL_8X7B = {
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
    "num_experts_per_tok": 2, "tie_word_embeddings": False, "max_position_embeddings": 32768,
}
LLAMA2_70B = {
    "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000, "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}
PUBLISHED_TOTALS = {
    "Qwen2.5-0.5B": (QWEN25_05B, 494_032_768),
    "Qwen2.5-7B": (QWEN25_7B, 7_615_616_512),
    "Mixtral-8x7B": (MIXTRAL_8X7B, 46_702_792_704),
    "Llama-2-70B": (LLAMA2_70B, 68_976_648_192),
}


def write_config_dir(directory: str, config: dict) -> str:
    """A model directory holding only config.json: enough for the planner and the config checks."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return directory
