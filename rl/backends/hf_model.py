"""Loading Hugging Face causal LMs for training and saving them back in Hugging Face format."""

from __future__ import annotations

import importlib.util
import os

import torch
from torch import Tensor, nn


def attention_implementation(device: torch.device, sequence_parallel: bool = False) -> str:
    """flash_attention_2 on GPU when installed, else PyTorch sdpa with per-sequence attention for packed rows
    (`rl.backends.varlen_attention`); both take a packed row's boundaries from the flash-attention packing kwargs.
    With `sequence_parallel` the same inside Ulysses' all-to-alls."""
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        name = "flash_attention_2"
    else:
        from rl.backends import varlen_attention

        name = varlen_attention.register()
    if sequence_parallel:
        from rl.backends import ulysses

        return ulysses.register(name)
    return name


def load_causal_lm(path: str, device: torch.device, sequence_parallel: bool = False) -> nn.Module:
    """An HF causal LM in fp32 on `device`; with `sequence_parallel` its attention runs through Ulysses
    (`rl.backends.ulysses`, inactive until the backend attaches a group)."""
    from transformers import AutoModelForCausalLM

    if not os.path.isdir(os.path.expanduser(path)) and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise FileNotFoundError(f"trainer.policy.model.path: no model directory at '{path}' (hub access is off)")
    model = AutoModelForCausalLM.from_pretrained(
        os.path.expanduser(path), dtype=torch.float32, attn_implementation=attention_implementation(device,
                                                                                                  sequence_parallel)
    )
    model.config.use_cache = False
    return model.to(device)


def save_hf_checkpoint(model_path: str, state_dict: dict[str, Tensor], output_dir: str) -> None:
    """Writes `state_dict` (HF names) as a checkpoint `from_pretrained` loads, with the source's config and
    tokenizer files; the directory appears complete or not at all (written beside, then renamed)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    staging = output_dir.rstrip("/") + ".partial"
    os.makedirs(staging, exist_ok=True)
    skeleton.save_pretrained(staging, state_dict=without_tied_copy(skeleton, state_dict), safe_serialization=True)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(staging)
    if os.path.isdir(output_dir):
        raise FileExistsError(f"{output_dir} already exists; exports are never overwritten")
    os.replace(staging, output_dir)


def without_tied_copy(skeleton: nn.Module, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """`state_dict` less the output embedding when the config ties it to the input embedding, as in the HF
    checkpoints `save_pretrained` writes itself; a gathered state dict may hold it as a separate copy, and every
    strategy's export must name the same tensors."""
    if not getattr(skeleton.config, "tie_word_embeddings", False):
        return state_dict
    output = skeleton.get_output_embeddings()
    tied = next((f"{name}.weight" for name, module in skeleton.named_modules() if module is output), None)
    return {name: tensor for name, tensor in state_dict.items() if name != tied}
