"""The embedded default's policy: a small Llama decoder made from a config, initialised from a seed.

Llama rather than Qwen2: transformers 5 loads a Qwen2 checkpoint's tokenizer as `Qwen2Tokenizer` whatever its
tokenizer_config.json names, rebuilding a byte-level BPE that drops the embedded tokenizer's pre-tokenizer; for a
Llama checkpoint it honours the saved `tokenizer.json`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

# size -> (hidden size, layers, attention heads, key-value heads, MLP width). "0.5b" is Qwen2.5-0.5B's layer shape
# (its decoder is 358M parameters; the embedded vocabulary keeps the embedding small), for runs on a GPU.
MODEL_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (128, 2, 4, 4, 512),
    "small": (192, 3, 6, 6, 768),
    "0.5b": (896, 24, 14, 2, 4864),
}
MAX_POSITIONS = 128


def tiny_model_config(tokenizer: PreTrainedTokenizerBase, size: str = "tiny") -> LlamaConfig:
    """A Llama config sized by `size` (a key of MODEL_SIZES) for `tokenizer`'s vocabulary and special tokens."""
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of: {', '.join(MODEL_SIZES)}")
    hidden, layers, heads, kv_heads, mlp = MODEL_SIZES[size]
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
    )


def build_model(config: LlamaConfig, seed: int) -> LlamaForCausalLM:
    """A freshly initialised fp32 model; the same (config, seed) gives the same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(torch.float32)


def save_pretrained_model(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> Path:
    """Write an HF checkpoint (config, safetensors weights, tokenizer) that `from_pretrained(directory)` loads."""
    path = Path(directory).expanduser()
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    check_tokenizer_reloads(tokenizer, path)
    return path


def check_tokenizer_reloads(tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """Fail loudly when `AutoTokenizer` would load the saved tokenizer as a different one (a model type whose
    registered tokenizer class overrides tokenizer.json), since every prompt would then be encoded wrongly."""
    probe = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12 + 34?"}], tokenize=False)
    reloaded = AutoTokenizer.from_pretrained(path)
    if (
        reloaded(probe, add_special_tokens=False)["input_ids"]
        != tokenizer(probe, add_special_tokens=False)["input_ids"]
    ):
        raise RuntimeError(
            f"{path}: AutoTokenizer reloads the saved tokenizer as {type(reloaded).__name__}, which encodes "
            "differently; save the model under a model type whose tokenizer class honours tokenizer.json"
        )
