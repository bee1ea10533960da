"""What a vision-language model (Qwen2-VL's family) takes beside a batch's tokens: its sequences' images and the
multimodal rotary positions.

A sequence's image placeholder tokens are in its `input_ids`; its `ImageInputs` (pixel values, patch grids) are
concatenated in batch order, which is the order the model matches placeholders to images in. M-RoPE gives every
token a (time, height, width) position: text tokens count on as one, an image's tokens take its grid coordinates.
The model's own `get_rope_index` computes them per sequence, so each sequence starts at 0 as it would alone.

The positions go in as transformers' four-row form, `[4, rows, length]`: row 0 the plain per-sequence positions,
rows 1-3 the M-RoPE ones. A packed row's boundaries reach per-sequence attention through the packing keywords, as
for text models (`rl.backends.varlen_attention`); row 0's restarts are what transformers' own attention masks tell
the sequences apart by, with no attention mask and no cache. The padded form goes with the attention mask.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rl.core.model_class import is_vision_language
from rl.core.packing import PackedBatch


def takes_images(model: nn.Module) -> bool:
    return is_vision_language(getattr(model, "config", None))


VISION_TOWER = "model.visual"  # where Qwen2-VL's family keeps its vision encoder and merger (HF names)


def vision_tower(model: nn.Module, required: bool = True) -> nn.Module | None:
    """The vision encoder (patch embedding, blocks, merger) of a Qwen2-VL-family model; for a model without one,
    None where not `required`."""
    tower = getattr(getattr(model, "model", None), "visual", None)
    if tower is None and required:
        raise ValueError(f"{type(model).__name__} has no vision tower at {VISION_TOWER}; the vision-language "
                         "models trained here are Qwen2-VL's and Qwen2.5-VL's")
    return tower


def multimodal_kwargs(model: nn.Module, batch: PackedBatch) -> dict[str, Tensor]:
    """`position_ids` (four-row form) and, when the batch has images, `pixel_values` and `image_grid_thw` for
    `model` (the Hugging Face model, unwrapped) over `batch`."""
    rope_index = getattr(getattr(model, "model", None), "get_rope_index", None)
    if rope_index is None:
        raise ValueError(f"{type(model).__name__} has no multimodal rotary positions (get_rope_index); the "
                         "vision-language models trained here are Qwen2-VL's and Qwen2.5-VL's")
    image_token = model.config.image_token_id
    starts, widths, lengths = batch.cu_seqlens[:-1].tolist(), batch.slot_lengths.tolist(), batch.seq_lengths.tolist()
    images = batch.images or (None,) * batch.num_sequences
    rows, pixels, grids = [], [], []
    for start, width, length, entry in zip(starts, widths, lengths, images, strict=True):
        ids = batch.input_ids[start:start + length]
        if entry is None:
            positions = torch.arange(length, device=ids.device).expand(3, length)
        else:
            placeholders = (ids == image_token).long()
            positions = rope_index(ids[None], placeholders[None], image_grid_thw=entry.grid_thw)[0][:, 0]
            pixels.append(entry.pixel_values)
            grids.append(entry.grid_thw)
        padding = torch.arange(1, width - length + 1, device=ids.device)
        rows.append(torch.cat([positions, positions[:, -1:] + padding], dim=1))
    rope = torch.cat(rows, dim=1) if rows else batch.position_ids.new_zeros(3, 0)
    four = torch.cat([batch.position_ids[None], rope.to(batch.position_ids.dtype)])
    out = {"position_ids": four.view(4, batch.num_sequences, -1) if batch.padded else four[:, None]}
    if pixels:
        out["pixel_values"] = torch.cat(pixels)
        out["image_grid_thw"] = torch.cat(grids)
    return out
