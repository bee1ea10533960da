"""Loss reductions and mini-batch normalizers against hand-computed values and a naive per-sequence loop."""

import pytest
import torch

from rl.core.algorithms import LOSS_REDUCTIONS, LossNormalizer, loss_counts, mini_batch_normalizer

F64 = torch.float64
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=F64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)  # row 2 has no loss token


def reduce(name, max_generate_length=None):
    normalizer = mini_batch_normalizer(name, MASK, max_generate_length=max_generate_length)
    return LOSS_REDUCTIONS.get(name)(LOSS, MASK, normalizer.denominator), normalizer


def test_counts_skip_sequences_without_loss_tokens():
    assert loss_counts(MASK) == (3, 2)


def test_token_mean_hand_computed():
    # (1 + 2 + 4) / 3 tokens
    value, normalizer = reduce("token_mean")
    assert normalizer.denominator == 3
    torch.testing.assert_close(value, torch.tensor(7 / 3, dtype=F64))


def test_sequence_mean_hand_computed():
    # sequence means 1.5 and 4 -> (1.5 + 4) / 2 sequences
    value, normalizer = reduce("sequence_mean")
    assert normalizer.denominator == 2
    torch.testing.assert_close(value, torch.tensor(2.75, dtype=F64))


def test_seq_mean_token_sum_norm_hand_computed():
    # token sum 7 / (2 sequences * max_generate_length 4)
    value, normalizer = reduce("seq_mean_token_sum_norm", max_generate_length=4)
    assert normalizer.denominator == 8
    torch.testing.assert_close(value, torch.tensor(0.875, dtype=F64))


def test_seq_mean_token_sum_norm_needs_max_generate_length():
    with pytest.raises(ValueError, match=r"generator\.max_generate_length"):
        mini_batch_normalizer("seq_mean_token_sum_norm", MASK)


def test_masked_out_nan_does_not_leak():
    loss = LOSS.clone()
    loss[2, 2] = float("nan")
    for name in LOSS_REDUCTIONS:
        normalizer = mini_batch_normalizer(name, MASK, max_generate_length=4)
        assert torch.isfinite(LOSS_REDUCTIONS.get(name)(loss, MASK, normalizer.denominator))


def naive(name, loss, mask, max_len):
    rows = [[v for v, m in zip(lr, mr, strict=True) if m] for lr, mr in zip(loss.tolist(), mask.tolist(), strict=True)]
    rows = [r for r in rows if r]
    if name == "token_mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if name == "sequence_mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    return sum(sum(r) for r in rows) / (len(rows) * max_len)


@pytest.mark.parametrize("name", ["token_mean", "sequence_mean", "seq_mean_token_sum_norm"])
def test_flat_layout_matches_naive_loop(name):
    gen = torch.Generator().manual_seed(5)
    loss = torch.randn(7, 6, generator=gen, dtype=F64)
    mask = torch.rand(7, 6, generator=gen) < 0.6
    flat_ids = torch.arange(7).unsqueeze(1).expand(7, 6).reshape(-1)
    normalizer = mini_batch_normalizer(name, mask.reshape(-1), seq_ids=flat_ids, max_generate_length=6)
    value = LOSS_REDUCTIONS.get(name)(loss.reshape(-1), mask.reshape(-1), normalizer.denominator, flat_ids, 7)
    torch.testing.assert_close(value, torch.tensor(naive(name, loss, mask, 6), dtype=F64))


def test_from_counts_and_empty_mini_batch():
    normalizer = LossNormalizer.from_counts("token_mean", 0, 0, dp_world_size=4)
    assert (normalizer.denominator, normalizer.num_tokens, normalizer.dp_world_size) == (1.0, 1.0, 4)
    with pytest.raises(ValueError, match="dp_world_size"):
        LossNormalizer.from_counts("token_mean", 3, 1, dp_world_size=0)
    with pytest.raises(KeyError, match="token_mean"):
        LossNormalizer.from_counts("token_mena", 3, 1)
