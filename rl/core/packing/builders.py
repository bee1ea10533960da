"""Build a `PackedBatch` from per-sequence tensors (packed or padded) and split results back per sequence.

Each input sequence is a mapping with ``input_ids`` and ``loss_mask`` (required) and optionally any of
`TOKEN_FIELDS`, all of the sequence's length and aligned with the target token (see batch.py): ``loss_mask[0]``
must be 0. A sequence may also carry ``images`` (an `ImageInputs`, or None for one without images). Every
sequence must carry the same keys; unknown keys are rejected rather than dropped.

No sequences give an empty batch (N = S = 0, every TOKEN_FIELDS entry an empty float tensor), which is what a rank
with nothing left to process runs so that its collective operations stay in step with the other ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from rl.core.packing.batch import TOKEN_FIELDS, PackedBatch

REQUIRED_FIELDS = ("input_ids", "loss_mask")
SEQUENCE_FIELDS = ("images",)  # one value per sequence, not per token
SequenceInput = Mapping[str, Tensor | Sequence[float]]


def _key_set(sequences: Sequence[SequenceInput]) -> list[str]:
    keys = set(sequences[0])
    allowed = [*REQUIRED_FIELDS, *TOKEN_FIELDS, *SEQUENCE_FIELDS]
    unknown = keys - set(allowed)
    if unknown:
        raise ValueError(f"sequence 0 has unknown keys {sorted(unknown)}; allowed: {allowed}")
    missing = [key for key in REQUIRED_FIELDS if key not in keys]
    if missing:
        raise ValueError(f"sequence 0 lacks the required keys {missing}")
    for i, seq in enumerate(sequences):
        if set(seq) != keys:
            raise ValueError(f"sequence {i} has keys {sorted(seq)} but sequence 0 has {sorted(keys)}")
    return [key for key in (*REQUIRED_FIELDS, *TOKEN_FIELDS) if key in keys]


def _concat(sequences: Sequence[SequenceInput]) -> tuple[list[int], dict[str, Tensor]]:
    keys = _key_set(sequences)
    lengths = [len(seq["input_ids"]) for seq in sequences]
    for i, length in enumerate(lengths):
        if length < 1:
            raise ValueError(f"sequence {i} is empty; every sequence needs at least one token")
    flat = {}
    for key in keys:
        bad = [i for i, seq in enumerate(sequences) if len(seq[key]) != lengths[i]]
        if bad:
            i = bad[0]
            raise ValueError(
                f"sequence {i}: '{key}' has {len(sequences[i][key])} entries but input_ids has {lengths[i]}"
            )
        flat[key] = torch.cat([torch.as_tensor(seq[key]).reshape(-1) for seq in sequences])
    flat["input_ids"] = flat["input_ids"].long()
    flat["loss_mask"] = flat["loss_mask"].bool()
    return lengths, flat


def _build(sequences, seq_index, slot_width, padded: bool, pad_token_id: int) -> PackedBatch:
    if not sequences:
        empty = torch.zeros(0, dtype=torch.long)
        cu = torch.zeros(1, dtype=torch.int32)
        floats = {key: torch.zeros(0) for key in TOKEN_FIELDS}
        return PackedBatch(empty, cu, cu[:0], empty, empty.bool(), empty, padded=padded, **floats)
    lengths, flat = _concat(sequences)
    device = flat["input_ids"].device
    lengths_t = torch.tensor(lengths, dtype=torch.long, device=device)
    widths = slot_width(lengths_t)
    cu = torch.cat([widths.new_zeros(1), widths.cumsum(0)])
    real_cu = torch.cat([widths.new_zeros(1), lengths_t.cumsum(0)])
    num_tokens, num_real = int(cu[-1].item()), sum(lengths)
    if bool(flat["loss_mask"][real_cu[:-1]].any()):
        first = int(flat["loss_mask"][real_cu[:-1]].nonzero()[0, 0])
        raise ValueError(
            f"sequence {first}: loss_mask[0] is set, but the first token has no prediction; per-token fields are "
            "aligned with the target token, so loss_mask must be 0 on each sequence's first token"
        )
    dest = torch.repeat_interleave(cu[:-1] - real_cu[:-1], lengths_t, output_size=num_real)
    dest = dest + torch.arange(num_real, device=device)

    def place(values: Tensor, fill) -> Tensor:
        out = values.new_full((num_tokens,), fill)
        out[dest] = values
        return out

    index = torch.arange(len(lengths)) if seq_index is None else torch.as_tensor(seq_index, dtype=torch.long)
    if index.shape != (len(lengths),):
        raise ValueError(f"seq_index has {index.numel()} entries for {len(lengths)} sequences")
    positions = torch.arange(num_tokens, device=device) - torch.repeat_interleave(
        cu[:-1], widths, output_size=num_tokens
    )
    return PackedBatch(
        input_ids=place(flat["input_ids"], pad_token_id),
        cu_seqlens=cu.to(torch.int32),
        seq_lengths=lengths_t.to(torch.int32),
        position_ids=positions,
        loss_mask=place(flat["loss_mask"], False),
        seq_index=index.to(device),
        padded=padded,
        images=tuple(seq["images"] for seq in sequences) if "images" in sequences[0] else None,
        **{key: place(flat[key], 0) for key in TOKEN_FIELDS if key in flat},
    )


def pack_sequences(
    sequences: Sequence[SequenceInput],
    seq_index: Sequence[int] | Tensor | None = None,
    *,
    pad_to_multiple_of: int = 1,
    pad_token_id: int = 0,
) -> PackedBatch:
    """Packed batch of `sequences` in the given order; `seq_index` (default 0..S-1) records their original indices.

    `pad_to_multiple_of` > 1 rounds every slot up to a multiple (alignment some model-parallel layouts need).
    """
    if pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
    multiple = pad_to_multiple_of

    def slot_width(lengths: Tensor) -> Tensor:
        return (lengths + multiple - 1) // multiple * multiple

    return _build(sequences, seq_index, slot_width, padded=False, pad_token_id=pad_token_id)


def pad_sequences(
    sequences: Sequence[SequenceInput],
    seq_index: Sequence[int] | Tensor | None = None,
    *,
    pad_to: int | None = None,
    pad_token_id: int = 0,
) -> PackedBatch:
    """Padded batch: every sequence right-padded to the longest (or to `pad_to`), flattened to N = S * L."""

    def slot_width(lengths: Tensor) -> Tensor:
        longest = int(lengths.max().item())
        if pad_to is not None and pad_to < longest:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest sequence ({longest} tokens)")
        return torch.full_like(lengths, longest if pad_to is None else pad_to)

    return _build(sequences, seq_index, slot_width, padded=True, pad_token_id=pad_token_id)


def _real_pieces(batch: PackedBatch, per_token: Tensor) -> tuple[Tensor, ...]:
    if per_token.shape[:1] != (batch.num_tokens,):
        raise ValueError(f"per_token must have N={batch.num_tokens} rows, got shape {tuple(per_token.shape)}")
    real = per_token[batch.real_token_mask().to(per_token.device)]
    return torch.split(real, batch.seq_lengths.tolist())


def unpack(batch: PackedBatch, per_token: Tensor) -> list[Tensor]:
    """Split a flat [N, ...] per-token tensor into one tensor per sequence (real tokens only), ordered by
    ascending `seq_index`: the original order when the batch holds sequences 0..S-1."""
    return unpack_micro_batches([batch], [per_token])


def unpack_micro_batches(batches: Sequence[PackedBatch], per_token: Sequence[Tensor]) -> list[Tensor]:
    """`unpack` over several micro-batches at once: one tensor per sequence, ordered by ascending `seq_index`."""
    if len(batches) != len(per_token):
        raise ValueError(f"got {len(batches)} batches but {len(per_token)} per-token tensors")
    pieces = [piece for batch, values in zip(batches, per_token, strict=True) for piece in _real_pieces(batch, values)]
    if not pieces:
        return []
    index = torch.cat([batch.seq_index.cpu() for batch in batches])
    return [pieces[i] for i in torch.argsort(index, stable=True).tolist()]
