"""A prompt's images in the form a vision-language model takes them, shared by the engines and the batch layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ImageInputs:
    """The images of one prompt (or sequence) as its model's processor prepared them: `pixel_values` [P, D] (the
    patches of all its images, in order) and `grid_thw` [n, 3] long (each image's patch grid: frames, height,
    width). `encoded`: the same images as the row gave them (e.g. PNG bytes), for an engine that runs the model's
    processor itself (vLLM); empty where nothing needs them."""

    pixel_values: Tensor
    grid_thw: Tensor
    encoded: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        if self.pixel_values.dim() != 2 or self.grid_thw.dim() != 2 or self.grid_thw.shape[1] != 3:
            raise ValueError(f"ImageInputs needs pixel_values [P, D] and grid_thw [n, 3], got "
                             f"{tuple(self.pixel_values.shape)} and {tuple(self.grid_thw.shape)}")
        patches = int(self.grid_thw.prod(-1).sum())
        if patches != self.pixel_values.shape[0]:
            raise ValueError(f"grid_thw {self.grid_thw.tolist()} holds {patches} patches, pixel_values has "
                             f"{self.pixel_values.shape[0]} rows")
        if self.encoded and len(self.encoded) != self.grid_thw.shape[0]:
            raise ValueError(f"{len(self.encoded)} encoded images for {self.grid_thw.shape[0]} image grids")

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ImageInputs:
        return ImageInputs(self.pixel_values.to(device, non_blocking=non_blocking),
                           self.grid_thw.to(device, non_blocking=non_blocking), self.encoded)
