"""`PackedBatch`: the one batch layout every backend consumes, packed (varlen) or padded.

Layout. Tokens of S sequences are laid out back to back in flat ``[N]`` tensors. Sequence i owns the *slot*
``cu_seqlens[i]:cu_seqlens[i + 1]``; its real tokens are the first ``seq_lengths[i]`` of the slot and the rest of
the slot is padding (``input_ids`` = pad id, ``loss_mask`` = False, float fields 0).

- packed (``padded=False``): slots hold only real tokens (``slot_lengths == seq_lengths``), unless built with
  ``pad_to_multiple_of`` > 1 (slots rounded up, e.g. for tensor/sequence-parallel alignment);
- padded (``padded=True``): every slot has the same width L, so ``as_padded(x)`` is an ``[S, L]`` view and the
  batch is what a right-padded HF forward takes (``attention_mask()`` gives the ``[S, L]`` mask).

``position_ids`` restart at 0 in every slot and keep counting through the slot's padding.

Images (vision-language models) ride as one optional per-sequence entry, ``images[i]``: the pixel values and patch
grids the model's processor made for sequence i's images (None for a sequence without images). The sequence's
image placeholder tokens are in its ``input_ids``; the backend turns both into what its model takes (the
multimodal rotary positions included, `rl.backends.multimodal`).

Logprob alignment. Per-token tensors (``loss_mask``, ``advantages``, ``old_logprobs``, ``ref_logprobs``,
``rollout_logprobs``) are aligned with the TARGET token: entry t holds log p(input_ids[t] | earlier tokens of the
same sequence); the critic's fields (``old_values``, ``returns``) likewise hold the value of the state before token t
(the critic's output at position t - 1). The first token of every sequence has no prediction, so its ``loss_mask``
is always False (the builders reject anything else). A model's logits at position t predict token t + 1: gather
log-softmax with ``prediction_targets()`` and move the result onto the targets with ``align_to_targets``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rl.core.images import ImageInputs

TOKEN_FIELDS = ("advantages", "old_logprobs", "ref_logprobs", "rollout_logprobs", "old_values", "returns")
"""Optional per-token float fields, aligned with the target token."""


@dataclass(frozen=True)
class PackedBatch:
    """Flat token tensors of S sequences (see the module docstring for the layout and alignment).

    input_ids [N] long, cu_seqlens [S+1] int32 (slot boundaries), seq_lengths [S] int32 (real tokens per slot),
    position_ids [N] long, loss_mask [N] bool, seq_index [S] long (each sequence's index in the original batch, for
    unpacking), optional float [N] fields in TOKEN_FIELDS, and `padded` (all slots of equal width).
    """

    input_ids: Tensor
    cu_seqlens: Tensor
    seq_lengths: Tensor
    position_ids: Tensor
    loss_mask: Tensor
    seq_index: Tensor
    advantages: Tensor | None = None
    old_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    rollout_logprobs: Tensor | None = None
    old_values: Tensor | None = None  # the critic's values before its update (value clipping)
    returns: Tensor | None = None  # the critic's targets (GAE's advantages + values)
    padded: bool = False
    images: tuple[ImageInputs | None, ...] | None = None  # per sequence (see the module docstring)

    def __post_init__(self) -> None:
        n, s = self.input_ids.numel(), self.seq_index.numel()
        if self.input_ids.dim() != 1:
            raise ValueError(f"input_ids must be flat [N], got shape {tuple(self.input_ids.shape)}")
        if self.cu_seqlens.shape != (s + 1,) or self.seq_lengths.shape != (s,):
            raise ValueError(
                f"cu_seqlens must be [S+1] and seq_lengths [S] for S={s} sequences (seq_index), got "
                f"{tuple(self.cu_seqlens.shape)} and {tuple(self.seq_lengths.shape)}"
            )
        for name in ("position_ids", "loss_mask", *TOKEN_FIELDS):
            value = getattr(self, name)
            if value is not None and value.shape[:1] != (n,):
                raise ValueError(f"{name} must have N={n} tokens like input_ids, got shape {tuple(value.shape)}")
        if self.padded and s and n % s:
            raise ValueError(f"a padded batch needs N divisible by S, got N={n}, S={s}")
        if self.images is not None and len(self.images) != s:
            raise ValueError(f"images must have one entry (or None) per sequence, got {len(self.images)} for S={s}")

    @property
    def has_images(self) -> bool:
        return self.images is not None and any(entry is not None for entry in self.images)

    @property
    def num_sequences(self) -> int:
        return self.seq_index.numel()

    @property
    def num_tokens(self) -> int:
        """Tokens in the flat layout, padding included (what a forward pass processes)."""
        return self.input_ids.numel()

    @property
    def slot_lengths(self) -> Tensor:
        """[S] width of each sequence's slot (real tokens + padding)."""
        return self.cu_seqlens[1:] - self.cu_seqlens[:-1]

    @property
    def padded_length(self) -> int:
        """L of the [S, L] view; padded batches only."""
        if not self.padded:
            raise ValueError("padded_length needs a padded batch (built by pad_sequences)")
        return self.num_tokens // self.num_sequences if self.num_sequences else 0

    def token_seq_ids(self) -> Tensor:
        """[N] long: the position (0..S-1) in this batch of the sequence owning each token."""
        ids = torch.arange(self.num_sequences, device=self.input_ids.device)
        return torch.repeat_interleave(ids, self.slot_lengths.long(), output_size=self.num_tokens)

    def real_token_mask(self) -> Tensor:
        """[N] bool: True on real tokens, False on padding."""
        return self.position_ids < self.seq_lengths.to(self.position_ids.dtype)[self.token_seq_ids()]

    def as_padded(self, tensor: Tensor | None = None) -> Tensor:
        """[S, L, ...] view of a flat [N, ...] tensor (default input_ids); padded batches only."""
        tensor = self.input_ids if tensor is None else tensor
        return tensor.view(self.num_sequences, self.padded_length, *tensor.shape[1:])

    def attention_mask(self) -> Tensor:
        """[S, L] bool mask of real tokens for a right-padded forward; padded batches only."""
        return self.as_padded(self.real_token_mask())

    def prediction_targets(self) -> Tensor:
        """[N] the token each position predicts (input_ids shifted left); wrong only at slot ends, never used."""
        return self.input_ids.roll(-1, dims=0)

    @staticmethod
    def align_to_targets(per_position: Tensor) -> Tensor:
        """Move a flat [N, ...] per-position result (logprob of the NEXT token) onto the target tokens.

        Slot starts receive the previous slot's last value; their loss_mask is False.
        """
        return per_position.roll(1, dims=0)

    def replace(self, **fields) -> PackedBatch:
        """A copy with some fields replaced (e.g. ``old_logprobs=...`` once the backend computed them)."""
        return dataclasses.replace(self, **fields)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        moved = {
            f.name: value.to(device, non_blocking=non_blocking)
            for f in dataclasses.fields(self)
            if isinstance(value := getattr(self, f.name), Tensor)
        }
        if self.images is not None:
            moved["images"] = tuple(None if entry is None else entry.to(device, non_blocking)
                                    for entry in self.images)
        return self.replace(**moved)

    def select(self, positions: Sequence[int] | Tensor) -> PackedBatch:
        """The sub-batch of the sequences at `positions` (positions in THIS batch, in the given order)."""
        pos = torch.as_tensor(positions, dtype=torch.long, device=self.cu_seqlens.device).reshape(-1)
        widths = self.slot_lengths.long()[pos]
        starts = self.cu_seqlens[:-1].long()[pos]
        cu = torch.cat([widths.new_zeros(1), widths.cumsum(0)])
        total = int(cu[-1].item()) if pos.numel() else 0
        offsets = torch.repeat_interleave(starts - cu[:-1], widths, output_size=total)
        tokens = (offsets + torch.arange(total, device=offsets.device)).to(self.input_ids.device)
        per_token = {
            name: getattr(self, name)[tokens]
            for name in ("input_ids", "position_ids", "loss_mask", *TOKEN_FIELDS)
            if getattr(self, name) is not None
        }
        return self.replace(
            cu_seqlens=cu.to(self.cu_seqlens.dtype),
            seq_lengths=self.seq_lengths[pos],
            seq_index=self.seq_index[pos.to(self.seq_index.device)],
            images=None if self.images is None else tuple(self.images[int(i)] for i in pos.tolist()),
            **per_token,
        )
