"""PackedBatch and its builders at their edges, against hand-written expectations: the dtypes the layout promises
(input_ids long, cu_seqlens and seq_lengths int32, loss_mask bool, seq_index long) whatever the inputs' dtypes, the
empty batch, per-token tensors with trailing dimensions, images riding along, and every check's message."""

import pytest
import torch

from rl.core.images import ImageInputs
from rl.core.packing import PackedBatch, pack_sequences, pad_sequences, unpack, unpack_micro_batches


def sequence(tokens, advantage, dtype=torch.long):
    n = len(tokens)
    return {"input_ids": torch.tensor(tokens, dtype=dtype), "loss_mask": torch.tensor([0] + [1] * (n - 1)),
            "advantages": torch.full((n,), float(advantage))}


SEQS = [sequence([5, 6, 7], 1.0), sequence([8], 2.0), sequence([9, 10, 11, 12], 3.0)]


def image(patches):
    return ImageInputs(torch.arange(patches * 2, dtype=torch.float32).reshape(patches, 2),
                       torch.tensor([[1, 1, patches]]))


def test_layout_dtypes_whatever_the_inputs():
    seqs = [sequence([5, 6], 1.0, dtype=torch.int32), sequence([7, 8, 9], 2.0, dtype=torch.int32)]
    for batch in (pack_sequences(seqs, seq_index=torch.tensor([4, 3], dtype=torch.int32)), pad_sequences(seqs)):
        assert batch.input_ids.dtype == torch.long and batch.position_ids.dtype == torch.long
        assert batch.cu_seqlens.dtype == torch.int32 and batch.seq_lengths.dtype == torch.int32
        assert batch.loss_mask.dtype == torch.bool and batch.seq_index.dtype == torch.long
        sub = batch.select([1])
        assert sub.cu_seqlens.dtype == torch.int32 and sub.seq_lengths.dtype == torch.int32


def test_empty_batches():
    for batch, padded in ((pack_sequences([]), False), (pad_sequences([]), True)):
        assert batch.padded is padded and (batch.num_sequences, batch.num_tokens) == (0, 0)
        assert batch.input_ids.dtype == torch.long and batch.cu_seqlens.tolist() == [0]
        assert batch.cu_seqlens.dtype == torch.int32 and batch.loss_mask.dtype == torch.bool
        assert batch.advantages.dtype == torch.float32 and batch.advantages.numel() == 0
    empty = pack_sequences(SEQS).select([])
    assert (empty.num_sequences, empty.num_tokens) == (0, 0) and empty.cu_seqlens.tolist() == [0]


def test_padding_of_the_token_fields_is_zero_and_the_pad_token_defaults_to_zero():
    batch = pad_sequences(SEQS)
    assert batch.as_padded(batch.advantages).tolist() == [[1, 1, 1, 0], [2, 0, 0, 0], [3, 3, 3, 3]]
    assert batch.as_padded().tolist() == [[5, 6, 7, 0], [8, 0, 0, 0], [9, 10, 11, 12]]
    packed = pack_sequences(SEQS[:2], pad_to_multiple_of=2)
    assert packed.input_ids.tolist() == [5, 6, 7, 0, 8, 0]
    assert packed.advantages.tolist() == [1, 1, 1, 0, 2, 0]
    assert pad_sequences(SEQS, pad_to=4).padded_length == 4  # the longest sequence fits exactly


def test_loss_mask_on_any_first_token_is_refused():
    seqs = [sequence([5, 6], 1.0), {**sequence([7, 8], 1.0), "loss_mask": torch.tensor([1, 1])}]
    with pytest.raises(ValueError, match=r"^sequence 1: loss_mask\[0\] is set, but the first token has no "
                                         r"prediction; per-token fields are aligned with the target token, so "
                                         r"loss_mask must be 0 on each sequence's first token$"):
        pack_sequences(seqs)


def test_builder_errors_name_the_input():
    with pytest.raises(ValueError, match=r"^seq_index has 2 entries for 3 sequences$"):
        pack_sequences(SEQS, seq_index=[0, 1])
    with pytest.raises(ValueError, match=r"^pad_to_multiple_of must be >= 1, got 0$"):
        pack_sequences(SEQS, pad_to_multiple_of=0)
    batch = pack_sequences(SEQS)
    with pytest.raises(ValueError, match=r"^per_token must have N=8 rows, got shape \(7,\)$"):
        unpack(batch, torch.zeros(7))
    with pytest.raises(ValueError, match=r"^got 1 batches but 2 per-token tensors$"):
        unpack_micro_batches([batch], [batch.advantages, batch.advantages])


def test_per_token_tensors_with_trailing_dimensions():
    # [N, 2] per-token values: a token field, the padded view, target alignment and unpacking keep the rows whole
    batch = pad_sequences(SEQS)
    rows = torch.arange(24.0).reshape(12, 2)
    assert batch.as_padded(rows).shape == (3, 4, 2)
    assert batch.as_padded(rows)[1, 0].tolist() == [8.0, 9.0]
    assert PackedBatch.align_to_targets(rows)[1].tolist() == [0.0, 1.0]
    assert PackedBatch.align_to_targets(rows)[0].tolist() == [22.0, 23.0]
    pieces = unpack(batch, rows)
    assert [p.shape for p in pieces] == [(3, 2), (1, 2), (4, 2)] and pieces[1].tolist() == [[8.0, 9.0]]
    with_rows = batch.replace(old_values=rows)
    assert with_rows.old_values.shape == (12, 2)


def test_construction_checks_name_the_field():
    batch = pack_sequences(SEQS)
    n = batch.num_tokens
    with pytest.raises(ValueError, match=r"^input_ids must be flat \[N\], got shape \(1, 8\)$"):
        batch.replace(input_ids=batch.input_ids.reshape(1, n))
    with pytest.raises(ValueError, match=r"^cu_seqlens must be \[S\+1\] and seq_lengths \[S\] for S=3 sequences "
                                         r"\(seq_index\), got \(4,\) and \(2,\)$"):
        batch.replace(seq_lengths=batch.seq_lengths[:2])
    for name in ("position_ids", "loss_mask", "advantages"):
        with pytest.raises(ValueError, match=rf"^{name} must have N=8 tokens like input_ids, got shape \(7,\)$"):
            batch.replace(**{name: getattr(batch, name)[:7]})
    with pytest.raises(ValueError, match=r"^a padded batch needs N divisible by S, got N=8, S=3$"):
        batch.replace(padded=True)
    with pytest.raises(ValueError, match=r"^images must have one entry \(or None\) per sequence, got 2 for S=3$"):
        batch.replace(images=(None, None))
    assert batch.replace(images=(None, None, None)).has_images is False


def test_images_ride_with_their_sequences():
    seqs = [{**s, "images": img} for s, img in zip(SEQS, (image(2), None, image(3)), strict=True)]
    batch = pack_sequences(seqs)
    assert batch.images[1] is None and torch.equal(batch.images[2].pixel_values, image(3).pixel_values)
    sub = batch.select([2, 1])
    assert sub.images[1] is None and torch.equal(sub.images[0].grid_thw, image(3).grid_thw)
    moved = batch.to("cpu")
    assert moved.images[1] is None and moved.has_images
    assert torch.equal(moved.images[0].pixel_values, image(2).pixel_values)
    assert torch.equal(moved.images[2].grid_thw, torch.tensor([[1, 1, 3]]))
