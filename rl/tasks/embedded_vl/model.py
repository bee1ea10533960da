"""A tiny Qwen2-VL model made from a config, with the embedded word-level tokenizer grown by Qwen2-VL's vision
tokens and an image processor built from arguments: a vision-language checkpoint with no hub download, for the
embedded visual task and the vision-language tests.

The chat format is the embedded one (`<|bos|><|user|>...<|end|><|assistant|>`); a message's content may also be
a list of parts, `{"type": "image"}` rendered as `<|vision_start|><|image_pad|><|vision_end|>` (the processor
repeats the pad once per merged patch of the image) and `{"type": "text", "text": ...}` as its text. Images are
resized to multiples of 28 pixels between `MIN_PIXELS` and `MAX_PIXELS` (Qwen2-VL's 14-pixel patches merged 2x2).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

from rl.core.processors import image_text_processor
from rl.tasks.embedded.tokenizer import build_tokenizer as build_embedded_tokenizer

VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD)
WORDS = ("How", "many", "squares")
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
PATCH, MERGE, FRAMES = 14, 2, 2  # Qwen2-VL's patch size, spatial merge and temporal patch
MIN_PIXELS, MAX_PIXELS = 28 * 28, 112 * 112
HIDDEN, LAYERS, HEADS, MLP = 64, 2, 2, 256  # head_dim 32: vLLM's CPU attention takes no smaller
VISION_WIDTH, VISION_DEPTH, VISION_HEADS = 32, 2, 2
MAX_POSITIONS = 256


def build_tokenizer() -> PreTrainedTokenizerBase:
    return build_embedded_tokenizer(specials=VISION_TOKENS, words=WORDS, chat_template=CHAT_TEMPLATE)


def build_processor(tokenizer: PreTrainedTokenizerBase | None = None):
    """Qwen2-VL's processor over the tokenizer and an image processor made from arguments."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    images = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH,
                                      merge_size=MERGE, temporal_patch_size=FRAMES)
    tokenizer = tokenizer or build_tokenizer()
    return image_text_processor(images, tokenizer, tokenizer.chat_template)


def tiny_vl_config(tokenizer: PreTrainedTokenizerBase, family: str = "qwen2_vl") -> Qwen2VLConfig | Qwen2_5_VLConfig:
    """The embedded visual task's model shape (`family` "qwen2_vl"); "qwen2_5_vl" gives Qwen2.5-VL's architecture
    at the same sizes (its vision tower's window attention over windows of 2 x 2 merged patches, full attention in
    the last block), for the tests of that family."""
    head_dim = HIDDEN // HEADS
    third = head_dim // 2 // 3  # M-RoPE splits the head's rotary half into time, height and width sections
    text = dict(vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=MLP, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=MAX_POSITIONS,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [head_dim // 2 - 2 * third, third, third]},
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id)
    ids = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
    tokens = dict(vision_start_token_id=ids[0], image_token_id=ids[1], vision_end_token_id=ids[2],
                  video_token_id=ids[3], tie_word_embeddings=False)
    if family == "qwen2_vl":
        vision = dict(depth=VISION_DEPTH, embed_dim=VISION_WIDTH, hidden_size=HIDDEN, num_heads=VISION_HEADS,
                      mlp_ratio=2, patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=FRAMES)
        return Qwen2VLConfig(text_config=text, vision_config=vision, **tokens)
    if family == "qwen2_5_vl":
        vision = dict(depth=VISION_DEPTH, hidden_size=VISION_WIDTH, intermediate_size=2 * VISION_WIDTH,
                      out_hidden_size=HIDDEN, num_heads=VISION_HEADS, patch_size=PATCH, spatial_merge_size=MERGE,
                      temporal_patch_size=FRAMES, window_size=2 * MERGE * PATCH,
                      fullatt_block_indexes=[VISION_DEPTH - 1])
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens)
    raise ValueError(f"family must be qwen2_vl or qwen2_5_vl, got {family!r}")


def build_model(config: Qwen2VLConfig | Qwen2_5_VLConfig, seed: int):
    """A freshly initialised fp32 model; the same (config, seed) gives the same weights."""
    architecture = Qwen2_5_VLForConditionalGeneration if isinstance(config, Qwen2_5_VLConfig) \
        else Qwen2VLForConditionalGeneration
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = architecture(config)
    return model.to(torch.float32)


def save_vl_model(model, processor, directory: str | Path) -> Path:
    """An HF checkpoint with the tokenizer and the image processor's files; refused when the tokenizer would not
    reload as itself (transformers may map a model type to another tokenizer class)."""
    path = Path(directory).expanduser()
    model.save_pretrained(path, safe_serialization=True)
    processor.image_processor.save_pretrained(path)  # the processor's own save needs a video processor
    processor.tokenizer.save_pretrained(path)
    probe = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many squares?"}]}],
        tokenize=False, add_generation_prompt=True)
    reloaded = AutoTokenizer.from_pretrained(path)
    if reloaded(probe, add_special_tokens=False)["input_ids"] != processor.tokenizer(
            probe, add_special_tokens=False)["input_ids"]:
        raise RuntimeError(f"{path}: the saved tokenizer reloads as {type(reloaded).__name__} and encodes "
                           "differently; the embedded vision-language checkpoint cannot be used")
    return path
