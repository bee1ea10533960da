"""The planner's steps traced by hand: the rank balance's tie on tokens (fewest sequences wins), the split of a bin
into two halves of near-equal load, which bin is split (the heaviest, the first of equals), and where the empty
micro-batches go."""

import pytest

from rl.core.packing import plan_micro_batches, plan_padded_micro_batches
from rl.core.packing.planner import balance_ranks, equalize_bin_count


def test_a_tie_on_tokens_goes_to_the_rank_with_fewer_sequences():
    # longest first: 2 -> r0 (2 tokens, 1 seq), 1 -> r1, 1 -> r1 (2 tokens, 2 seqs), then the tie on 2 tokens goes
    # to r0, which holds fewer sequences
    assert balance_ranks([2, 1, 1, 1], 2) == [[0, 3], [1, 2]]


def test_a_bin_splits_into_halves_of_near_equal_load():
    # lengths 3, 2, 1, 1 longest first, each to the lighter half (the first on a tie): 3 -> h0, 2 -> h1,
    # 1 -> h1 (3 vs 2), 1 -> h0 (3 vs 3): loads 4 and 3
    assert equalize_bin_count([[0, 1, 2, 3]], [3, 2, 1, 1], 2) == [[0, 3], [1, 2]]


def test_the_heaviest_bin_is_split_in_place():
    # bin 0 weighs 6, bin 1 weighs 2: bin 0 is split and its halves take its place
    assert equalize_bin_count([[2, 3], [0, 1]], [1, 1, 3, 3], 3) == [[2], [3], [0, 1]]
    # equal loads: the first of them
    assert equalize_bin_count([[0, 1], [2, 3]], [1, 1, 1, 1], 3) == [[0], [1], [2, 3]]


def test_single_sequence_bins_are_never_split_and_empty_bins_go_last():
    assert equalize_bin_count([[0], [1]], [5, 3], 3) == [[0], [1], []]
    assert equalize_bin_count([[0, 1], [2]], [5, 3, 9], 4) == [[0], [1], [2], []]


def test_an_over_long_sequence_names_both_keys_that_fix_it():
    with pytest.raises(ValueError, match=r"^sequence 1 has 9 tokens, more than the micro-batch budget of 8 tokens; "
                                         r"raise trainer\.max_tokens_per_micro_batch to at least 9, or lower the "
                                         r"prompt / response length limits \(e\.g\. generator\.max_generate_length\)$"):
        plan_micro_batches([3, 9], 8, 1)


def test_padded_plan_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"^dp_size must be >= 1, got 0$"):
        plan_padded_micro_batches(4, 2, 0)
    with pytest.raises(ValueError, match=r"^num_seqs must be >= 0, got -1$"):
        plan_padded_micro_batches(-1, 2, 1)
    assert plan_padded_micro_batches(0, 2, 2) == [[], []]
