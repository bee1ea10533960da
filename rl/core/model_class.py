"""Which Hugging Face auto class builds a generating model of a config: the engines and the backends load the same
models."""

from __future__ import annotations


def is_vision_language(config) -> bool:
    """Whether an HF config is a vision-language model's (Qwen2-VL's kind: a vision tower beside the language
    model)."""
    return getattr(config, "vision_config", None) is not None


VISION_TOKENS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def vision_token_ids(config) -> tuple[int, ...]:
    """The token ids of a vision-language config (an HF config or its config.json as a dict) that only the processor
    writes (placeholders, vision start and end): an engine never samples them. Empty for a text model."""
    get = config.get if isinstance(config, dict) else (lambda name: getattr(config, name, None))
    if get("vision_config") is None:
        return ()
    return tuple(token for name in VISION_TOKENS if (token := get(name)) is not None)


def generative_class(config):
    """The auto class that builds a generating model of `config`: image-text-to-text for a vision-language model,
    causal LM otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM


def load_generative(path: str, **kwargs):
    """The generating model at `path` (`generative_class` of its config), `from_pretrained` with `kwargs`."""
    from transformers import AutoConfig

    return generative_class(AutoConfig.from_pretrained(path)).from_pretrained(path, **kwargs)
