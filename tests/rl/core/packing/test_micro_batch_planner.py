"""Micro-batch planner: hand-traced plans, lockstep micro-batch counts and error messages."""

import pytest

from rl.core.packing import plan_micro_batches, plan_padded_micro_batches


def test_hand_traced_plan():
    # longest first to the lighter rank: 8 -> r0, 7 -> r1, 5 -> r1 (12), 3 -> r0 (11), 2 -> r0 (13),
    # 1 (#3) -> r1 (13), 1 (#4) -> r0 (tie on tokens and count, lowest rank)
    # r0 = {2: 8, 1: 3, 5: 2, 4: 1} -> FFD under 8: [8], [3, 2, 1];  r1 = {6: 7, 0: 5, 3: 1} -> [7, 1], [5]
    plan = plan_micro_batches([5, 3, 8, 1, 1, 2, 7], 8, 2)
    assert plan == [[[2], [1, 4, 5]], [[3, 6], [0]]]


def test_rank_with_fewer_bins_splits_its_heaviest():
    # budget 10: 6 (#0) -> r0, 6 (#1) -> r1, 5 (#2) -> r0 (tie, lowest rank), 4 (#3) -> r1 (10 < 11)
    # r0 = {6, 5} -> FFD [6], [5] (11 > 10): 2 bins;  r1 = {6, 4} -> [6, 4]: 1 bin, split into [6], [4]
    assert plan_micro_batches([6, 6, 5, 4], 10, 2) == [[[0], [2]], [[1], [3]]]


def test_rank_with_too_few_sequences_gets_an_empty_micro_batch():
    # budget 10: 10 -> r0, then the four 3s all go to r1 (3, 6, 9 < 10, then 9 < 10 -> 12)
    # r1 = FFD [3, 3, 3], [3]: 2 bins; r0 holds one sequence, so its second micro-batch is empty
    assert plan_micro_batches([10, 3, 3, 3, 3], 10, 2) == [[[0], []], [[1, 2, 3], [4]]]
    assert plan_micro_batches([4, 2], 8, 3) == [[[0]], [[1]], [[]]]


def test_split_never_leaves_empty_when_avoidable():
    # r0 = {0} (budget-sized) plus more sequences on r0 than r1; r1's single bin is split instead of padding
    plan = plan_micro_batches([9, 9, 9, 2, 2, 2, 2], 9, 2)
    counts = [len(rank) for rank in plan]
    assert counts[0] == counts[1]
    for rank in plan:
        assert all(rank_bin for rank_bin in rank)


def test_over_long_sequence_names_index_length_budget_and_key():
    with pytest.raises(ValueError, match=r"sequence 2 has 700 tokens.*budget of 512.*trainer\.max_tokens_per_micro"):
        plan_micro_batches([10, 512, 700], 512, 1)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
        plan_micro_batches([1], 0, 1)
    with pytest.raises(ValueError, match="dp_size"):
        plan_micro_batches([1], 4, 0)
    with pytest.raises(ValueError, match="sequence 1 has length 0"):
        plan_micro_batches([1, 0], 4, 1)
    with pytest.raises(ValueError, match="micro_batch_size"):
        plan_padded_micro_batches(4, 0, 1)


def test_padded_plan():
    assert plan_padded_micro_batches(8, 2, 2) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    # 5 sequences on 2 ranks: shares of 3 and 2; 3 micro-batches of one, so rank 1 ends with an empty one
    assert plan_padded_micro_batches(5, 1, 2) == [[[0], [1], [2]], [[3], [4], []]]
    assert plan_padded_micro_batches(5, 3, 2) == [[[0, 1, 2]], [[3, 4]]]
