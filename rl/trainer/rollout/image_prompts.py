"""Prompts with images as a vision-language model's engine takes them: the chat through the processor's template,
each `<image>` mark of the record's text an image part, and the processor's token ids (each image's placeholder
repeated once per merged patch) with the prompt's `ImageInputs`, prepared once per prompt.

A prompt with images is never cut to generator.max_prompt_length: a cut could split an image's tokens from its
pixels, so a longer one is refused as data.truncation=error refuses any.
"""

from __future__ import annotations

import io

from rl.core.data import PromptRecord
from rl.core.data.images import image_parts
from rl.core.images import ImageInputs


def image_messages(record: PromptRecord) -> list[dict]:
    """The record's chat with each message's content as parts: text, and an image part at each `<image>` mark."""
    if not record.is_chat:
        raise ValueError(f"{record.where}: a prompt with images must be a chat (a list of messages), so the model's "
                         "chat template places the images")
    return image_parts(record.messages())


def encode_with_images(processor, record: PromptRecord) -> tuple[list[int], ImageInputs | None]:
    """(the prompt's token ids with the generation prompt, its images as the model takes them or None)."""
    if not record.images:
        text = processor.apply_chat_template(record.messages(), add_generation_prompt=True, tokenize=False) \
            if record.is_chat else record.prompt
        return processor.tokenizer(text, add_special_tokens=False)["input_ids"], None
    from PIL import Image

    text = processor.apply_chat_template(image_messages(record), add_generation_prompt=True, tokenize=False)
    images = [Image.open(io.BytesIO(data)).convert("RGB") for data in record.images]
    out = processor(text=[text], images=images, return_tensors="pt")
    return out["input_ids"][0].tolist(), ImageInputs(out["pixel_values"], out["image_grid_thw"], tuple(record.images))
