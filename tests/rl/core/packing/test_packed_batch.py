"""PackedBatch layout, builders and unpacking against hand-written expectations and naive per-sequence loops."""

import pytest
import torch

from rl.core.packing import PackedBatch, pack_sequences, pad_sequences, unpack, unpack_micro_batches


def sequence(tokens, advantage):
    n = len(tokens)
    return {
        "input_ids": torch.tensor(tokens),
        "loss_mask": torch.tensor([0] + [1] * (n - 1)),
        "advantages": torch.full((n,), float(advantage)),
    }


SEQS = [sequence([5, 6, 7], 1.0), sequence([8], 2.0), sequence([9, 10, 11, 12], 3.0)]


def test_packed_layout_by_hand():
    batch = pack_sequences(SEQS, seq_index=[2, 0, 1])
    assert batch.input_ids.tolist() == [5, 6, 7, 8, 9, 10, 11, 12]
    assert batch.cu_seqlens.tolist() == [0, 3, 4, 8] and batch.cu_seqlens.dtype == torch.int32
    assert batch.position_ids.tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    assert batch.loss_mask.tolist() == [False, True, True, False, False, True, True, True]
    assert batch.advantages.tolist() == [1, 1, 1, 2, 3, 3, 3, 3]
    assert batch.token_seq_ids().tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert (batch.num_sequences, batch.num_tokens, batch.padded) == (3, 8, False)
    assert batch.old_logprobs is None


def test_padded_layout_by_hand():
    batch = pad_sequences(SEQS, pad_token_id=-1)
    assert batch.padded and batch.padded_length == 4
    assert batch.as_padded().tolist() == [[5, 6, 7, -1], [8, -1, -1, -1], [9, 10, 11, 12]]
    assert batch.cu_seqlens.tolist() == [0, 4, 8, 12] and batch.seq_lengths.tolist() == [3, 1, 4]
    assert batch.as_padded(batch.position_ids).tolist() == [[0, 1, 2, 3]] * 3
    assert batch.attention_mask().tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert batch.as_padded(batch.loss_mask).tolist() == [[0, 1, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1]]
    assert pad_sequences(SEQS, pad_to=6).padded_length == 6


def test_pad_to_multiple_keeps_real_tokens():
    batch = pack_sequences(SEQS, pad_to_multiple_of=4)
    assert batch.cu_seqlens.tolist() == [0, 4, 8, 12]
    assert batch.position_ids.tolist() == [0, 1, 2, 3] * 3
    assert [t.tolist() for t in unpack(batch, batch.input_ids)] == [[5, 6, 7], [8], [9, 10, 11, 12]]


def test_unpack_restores_original_order():
    order = [2, 0, 1]
    batch = pack_sequences([SEQS[i] for i in [1, 2, 0]], seq_index=[1, 2, 0])
    assert [t.tolist() for t in unpack(batch, batch.input_ids)] == [[5, 6, 7], [8], [9, 10, 11, 12]]
    first, second = pad_sequences([SEQS[order[0]]], [order[0]]), pack_sequences([SEQS[0], SEQS[1]], [0, 1])
    pieces = unpack_micro_batches([first, second], [first.advantages, second.advantages])
    assert [p.tolist() for p in pieces] == [[1.0] * 3, [2.0], [3.0] * 4]


def test_select_and_to():
    batch = pad_sequences(SEQS, seq_index=[10, 11, 12])
    sub = batch.select([2, 0]).to("cpu")
    assert sub.padded and sub.seq_index.tolist() == [12, 10]
    assert sub.as_padded().tolist() == [[9, 10, 11, 12], [5, 6, 7, 0]]
    packed = pack_sequences(SEQS).select(torch.tensor([1]))
    assert packed.input_ids.tolist() == [8] and packed.cu_seqlens.tolist() == [0, 1]


def test_target_alignment_with_a_toy_model():
    # per-token logprobs aligned with the target token: entry t = log p(input_ids[t] | tokens before t)
    vocab = 16
    torch.manual_seed(0)
    table = torch.randn(vocab, vocab, dtype=torch.float64)  # logits at a position depend on its token only
    for batch in (pack_sequences(SEQS), pad_sequences(SEQS)):
        logits = table[batch.input_ids]
        per_position = torch.log_softmax(logits, -1).gather(-1, batch.prediction_targets().unsqueeze(-1)).squeeze(-1)
        aligned = PackedBatch.align_to_targets(per_position)
        for seq, values in zip(SEQS, unpack(batch, aligned), strict=True):
            tokens = seq["input_ids"].tolist()
            for t in range(1, len(tokens)):  # naive: token t predicted from token t - 1
                want = torch.log_softmax(table[tokens[t - 1]], -1)[tokens[t]]
                torch.testing.assert_close(values[t], want)
        assert not bool(batch.loss_mask[batch.cu_seqlens[:-1].long()].any())


def test_empty_batch_is_representable():
    batch = pack_sequences([])
    assert (batch.num_sequences, batch.num_tokens) == (0, 0)
    assert batch.cu_seqlens.tolist() == [0] and batch.advantages.numel() == 0
    assert unpack(batch, batch.input_ids) == []


@pytest.mark.parametrize(
    ("sequences", "message"),
    [
        ([{"input_ids": [1, 2], "loss_mask": [1, 1]}], r"sequence 0: loss_mask\[0\]"),
        ([{"input_ids": [1, 2], "loss_mask": [0, 1, 1]}], "sequence 0: 'loss_mask' has 3 entries"),
        (
            [{"input_ids": [1], "loss_mask": [0]}, {"input_ids": [1], "loss_mask": [0], "advantages": [0.0]}],
            "sequence 1 has keys",
        ),
        ([{"input_ids": [1], "loss_mask": [0], "reward": [1.0]}], r"unknown keys \['reward'\]"),
        ([{"input_ids": [1]}], r"required keys \['loss_mask'\]"),
        ([{"input_ids": [], "loss_mask": []}], "sequence 0 is empty"),
    ],
)
def test_bad_input_names_the_sequence_and_key(sequences, message):
    with pytest.raises(ValueError, match=message):
        pack_sequences(sequences)


def test_pad_to_too_short():
    with pytest.raises(ValueError, match="pad_to=2"):
        pad_sequences(SEQS, pad_to=2)
