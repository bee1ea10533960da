"""Loading Hugging Face causal LMs for training and saving them back in Hugging Face format."""

from __future__ import annotations

import importlib.util
import os
import shutil

import torch
from torch import Tensor, nn

from rl.core.model_class import generative_class, is_vision_language, load_generative


def attention_implementation(device: torch.device, sequence_parallel: bool = False, flash_attn: bool | None = None,
                             bf16: bool | None = None) -> str:
    """flash_attention_2 or PyTorch sdpa with per-sequence attention for packed rows
    (`rl.backends.varlen_attention`); both take a packed row's boundaries from the flash-attention packing kwargs.
    `flash_attn` is trainer.flash_attn: true asks for flash_attention_2 (a ValueError where it cannot run: without
    the flash-attn package, off a GPU, or in float32, which its kernels do not take), false for sdpa_varlen, null
    for flash_attention_2 where it can run (the fallback printed on a GPU). `bf16` is trainer.bf16 (null: on a GPU).
    With `sequence_parallel` the same inside Ulysses' all-to-alls."""
    from rl.backends.precision import bf16_compute

    blockers = [why for why, blocked in (
        ("the flash-attn package is not installed", importlib.util.find_spec("flash_attn") is None),
        (f"the device is {device.type}, not a GPU", device.type != "cuda"),
        ("trainer.bf16 is false (its kernels take bf16 and fp16 only)", not bf16_compute(bf16, device)),
    ) if blocked]
    if flash_attn and blockers:
        raise ValueError(f"trainer.flash_attn is true, but {'; '.join(blockers)}: set trainer.flash_attn=null "
                         "(flash-attention where it can run) or false (PyTorch SDPA)")
    if flash_attn is None and device.type == "cuda" and blockers:
        print(f"trainer.flash_attn: attention runs through PyTorch SDPA per sequence (sdpa_varlen): "
              f"{'; '.join(blockers)}", flush=True)
    if flash_attn is not False and not blockers:
        name = "flash_attention_2"
    else:
        from rl.backends import varlen_attention

        name = varlen_attention.register()
    if sequence_parallel:
        from rl.backends import ulysses

        return ulysses.register(name)
    return name


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "chat_template.jinja", "chat_template.json")


def load_causal_lm(path: str, device: torch.device, sequence_parallel: bool = False, flash_attn: bool | None = None,
                   bf16: bool | None = None) -> nn.Module:
    """An HF causal LM (or a vision-language model) in fp32 on `device` (mixed precision is the strategy's); with
    `sequence_parallel` its attention runs through Ulysses (`rl.backends.ulysses`, inactive until the backend
    attaches a group); `flash_attn` and `bf16` pick the attention kernel (`attention_implementation`), for the
    vision tower too."""
    if not os.path.isdir(os.path.expanduser(path)) and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise FileNotFoundError(f"trainer.policy.model.path: no model directory at '{path}' (hub access is off)")
    attention = attention_implementation(device, sequence_parallel, flash_attn, bf16)
    model = load_generative(os.path.expanduser(path), dtype=torch.float32, attn_implementation=attention)
    model.config.use_cache = False
    if is_vision_language(model.config):  # a packed row is only told apart without a cache (transformers' masks)
        model.config.text_config.use_cache = False
    return model.to(device)


def save_hf_checkpoint(model_path: str, state_dict: dict[str, Tensor], output_dir: str, critic: bool = False
                       ) -> None:
    """Writes `state_dict` (HF names) as a checkpoint `from_pretrained` loads, with the source's config and
    tokenizer files; the directory appears complete or not at all (written beside, then renamed). A `critic`'s
    state (`rl.backends.value_head`) is written as a one-label token classifier."""
    from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

    if critic:
        from rl.backends.value_head import critic_config, hf_critic_state

        config, auto = critic_config(model_path), AutoModelForTokenClassification
        state_dict = hf_critic_state(state_dict)
    else:
        config = AutoConfig.from_pretrained(model_path)
        auto = generative_class(config)
    with torch.device("meta"):
        skeleton = auto.from_config(config)
    staging = output_dir.rstrip("/") + ".partial"
    os.makedirs(staging, exist_ok=True)
    skeleton.save_pretrained(staging, state_dict=without_tied_copy(skeleton, state_dict), safe_serialization=True)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(staging)
    for name in PROCESSOR_FILES:  # a vision-language model's image processor and chat template travel as files
        if os.path.isfile(source := os.path.join(os.path.expanduser(model_path), name)):
            shutil.copyfile(source, os.path.join(staging, name))
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
