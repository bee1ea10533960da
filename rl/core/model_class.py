"""Which Hugging Face auto class builds a generating model of a config: the engines and the backends load the same
models."""

from __future__ import annotations


def is_vision_language(config) -> bool:
    """Whether an HF config is a vision-language model's (Qwen2-VL's kind: a vision tower beside the language
    model)."""
    return getattr(config, "vision_config", None) is not None


def generative_class(config):
    """The auto class that builds a generating model of `config`: image-text-to-text for a vision-language model,
    causal LM otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM


def load_generative(path: str, **kwargs):
    """The generating model at `path` (`generative_class` of its config), `from_pretrained` with `kwargs`."""
    from transformers import AutoConfig

    return generative_class(AutoConfig.from_pretrained(path)).from_pretrained(path, **kwargs)
