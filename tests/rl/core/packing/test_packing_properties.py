"""Property tests: planning + packing + unpacking over random lengths, budgets and data-parallel sizes."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.core.packing import (
    pack_sequences,
    pad_sequences,
    plan_micro_batches,
    plan_padded_micro_batches,
    unpack,
    unpack_micro_batches,
)

SETTINGS = settings(max_examples=100, deadline=None, database=None)


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Thousands of tiny tensor ops: intra-op threads only add contention on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_sequences(lengths):
    gen = torch.Generator().manual_seed(len(lengths))
    seqs = []
    for n in lengths:
        seqs.append(
            {
                "input_ids": torch.randint(0, 1000, (n,), generator=gen),
                "loss_mask": torch.cat([torch.zeros(1), (torch.rand(n - 1, generator=gen) < 0.7).float()]),
                "advantages": torch.randn(n, generator=gen),
                "old_logprobs": -torch.rand(n, generator=gen),
            }
        )
    return seqs


def check_plan(plan, lengths, budget, dp):
    assert len(plan) == dp
    assert len({len(rank) for rank in plan}) == 1, "every rank runs the same number of micro-batches"
    assert sorted(i for rank in plan for mb in rank for i in mb) == list(range(len(lengths)))
    for rank in plan:
        assert all(sum(lengths[i] for i in mb) <= budget for mb in rank)
        if any(not mb for mb in rank):  # an empty micro-batch only when the rank lacks sequences to fill them
            assert sum(len(mb) for mb in rank) < len(rank)


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 40), max_size=30),
    slack=st.integers(0, 60),
    dp=st.integers(1, 4),
    multiple=st.sampled_from([1, 1, 4]),
)
def test_plan_pack_unpack_round_trip(lengths, slack, dp, multiple):
    budget = max(lengths, default=1) + slack
    plan = plan_micro_batches(lengths, budget, dp)
    check_plan(plan, lengths, budget, dp)
    seqs = make_sequences(lengths)
    micro = [mb for rank in plan for mb in rank]
    packed = [pack_sequences([seqs[i] for i in mb], mb, pad_to_multiple_of=multiple) for mb in micro]
    padded = [pad_sequences([seqs[i] for i in mb], mb) for mb in micro]
    for batch in packed:
        if multiple == 1:
            assert batch.num_tokens <= budget
    for batches in (packed, padded):
        for field in ("input_ids", "loss_mask", "advantages", "old_logprobs"):
            pieces = unpack_micro_batches(batches, [getattr(b, field) for b in batches])
            assert len(pieces) == len(seqs)
            for piece, seq in zip(pieces, seqs, strict=True):
                assert torch.equal(piece, seq[field].to(piece.dtype))
        for batch in batches:
            positions = unpack(batch, batch.position_ids)
            assert all(torch.equal(p, torch.arange(len(p))) for p in positions)
            naive_ids = [k for k, width in enumerate(batch.slot_lengths.tolist()) for _ in range(width)]
            assert batch.token_seq_ids().tolist() == naive_ids
            assert int(batch.loss_mask.sum()) == sum(int(seqs[i]["loss_mask"].sum()) for i in batch.seq_index)


@SETTINGS
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=20), extra=st.integers(1, 50), data=st.data())
def test_over_long_sequence_is_named(lengths, extra, data):
    budget = max(lengths)
    position = data.draw(st.integers(0, len(lengths)))
    lengths = [*lengths[:position], budget + extra, *lengths[position:]]
    try:
        plan_micro_batches(lengths, budget, 2)
    except ValueError as error:
        assert f"sequence {position} has {budget + extra} tokens" in str(error)
        assert f"budget of {budget} tokens" in str(error)
        assert "trainer.max_tokens_per_micro_batch" in str(error)
    else:
        raise AssertionError("an over-long sequence must raise")


@SETTINGS
@given(num_seqs=st.integers(0, 50), micro_batch_size=st.integers(1, 8), dp=st.integers(1, 4))
def test_padded_plan_properties(num_seqs, micro_batch_size, dp):
    plan = plan_padded_micro_batches(num_seqs, micro_batch_size, dp)
    assert len(plan) == dp and len({len(rank) for rank in plan}) == 1
    assert sorted(i for rank in plan for mb in rank for i in mb) == list(range(num_seqs))
    assert all(len(mb) <= micro_batch_size for rank in plan for mb in rank)
    shares = [sum(len(mb) for mb in rank) for rank in plan]
    assert max(shares) - min(shares) <= 1
