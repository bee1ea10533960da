"""The embedded default's policy: a small Qwen2 decoder made from a config, initialised from a seed."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

# size -> (hidden size, layers, attention heads, MLP width); every size uses a head dimension of 32.
MODEL_SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (128, 2, 4, 512),
    "small": (192, 3, 6, 768),
}
MAX_POSITIONS = 128


def tiny_model_config(tokenizer: PreTrainedTokenizerBase, size: str = "tiny") -> Qwen2Config:
    """A Qwen2 config sized by `size` (a key of MODEL_SIZES) for `tokenizer`'s vocabulary and special tokens."""
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of: {', '.join(MODEL_SIZES)}")
    hidden, layers, heads, mlp = MODEL_SIZES[size]
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
    )


def build_model(config: Qwen2Config, seed: int) -> Qwen2ForCausalLM:
    """A freshly initialised fp32 model; the same (config, seed) gives the same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.to(torch.float32)


def save_pretrained_model(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> Path:
    """Write an HF checkpoint (config, safetensors weights, tokenizer) that `from_pretrained(directory)` loads."""
    path = Path(directory).expanduser()
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
