"""Micro-batch planning: which sequences each data-parallel (DP) rank processes in which micro-batch.

Plans are ``plan[rank][micro_batch] -> list of sequence indices`` (indices into the mini-batch, ascending within a
micro-batch). Every rank gets the SAME number of micro-batches, because each micro-batch runs collective operations
(FSDP gathers, gradient reductions) that must stay in lockstep. When a rank has fewer sequences than that common
count, its last micro-batches are empty lists (build them into empty `PackedBatch`es: ``pack_sequences([])``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

BUDGET_KEY = "trainer.max_tokens_per_micro_batch"


def _check_lengths(seq_lengths: Sequence[int], budget: int, dp_size: int) -> list[int]:
    if budget < 1:
        raise ValueError(f"{BUDGET_KEY} must be >= 1, got {budget}")
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    lengths = [int(length) for length in seq_lengths]
    for i, length in enumerate(lengths):
        if length < 1:
            raise ValueError(f"sequence {i} has length {length}; every sequence needs at least one token")
        if length > budget:
            raise ValueError(
                f"sequence {i} has {length} tokens, more than the micro-batch budget of {budget} tokens; raise "
                f"{BUDGET_KEY} to at least {length}, or lower the prompt / response length limits "
                "(e.g. generator.max_generate_length)"
            )
    return lengths


def _by_length_desc(indices: Sequence[int], lengths: Sequence[int]) -> list[int]:
    return sorted(indices, key=lambda i: (-lengths[i], i))


def balance_ranks(lengths: Sequence[int], dp_size: int) -> list[list[int]]:
    """Longest first, each sequence to the rank with the fewest tokens (then fewest sequences, then lowest rank)."""
    heap = [(0, 0, rank) for rank in range(dp_size)]
    ranks: list[list[int]] = [[] for _ in range(dp_size)]
    for i in _by_length_desc(range(len(lengths)), lengths):
        tokens, count, rank = heapq.heappop(heap)
        ranks[rank].append(i)
        heapq.heappush(heap, (tokens + lengths[i], count + 1, rank))
    return ranks


def first_fit_decreasing(indices: Sequence[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Bins of sequence indices, each holding at most `budget` tokens (first fit, longest first)."""
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in _by_length_desc(indices, lengths):
        target = next((b for b, load in enumerate(loads) if load + lengths[i] <= budget), len(bins))
        if target == len(bins):
            bins.append([])
            loads.append(0)
        bins[target].append(i)
        loads[target] += lengths[i]
    return bins


def _split_in_two(members: list[int], lengths: Sequence[int]) -> tuple[list[int], list[int]]:
    halves: tuple[list[int], list[int]] = ([], [])
    loads = [0, 0]
    for i in _by_length_desc(members, lengths):
        lighter = 0 if loads[0] <= loads[1] else 1
        halves[lighter].append(i)
        loads[lighter] += lengths[i]
    return halves


def equalize_bin_count(bins: list[list[int]], lengths: Sequence[int], count: int) -> list[list[int]]:
    """Grow `bins` to `count` bins by splitting the heaviest bin of 2+ sequences; empty bins once none is left."""
    bins = [list(b) for b in bins]
    while len(bins) < count:
        splittable = [b for b in range(len(bins)) if len(bins[b]) > 1]
        if not splittable:
            bins.extend([] for _ in range(count - len(bins)))
            break
        heaviest = max(splittable, key=lambda b: (sum(lengths[i] for i in bins[b]), -b))
        first, second = _split_in_two(bins[heaviest], lengths)
        bins[heaviest : heaviest + 1] = [first, second]
    return bins


def plan_micro_batches(
    seq_lengths: Sequence[int], max_tokens_per_micro_batch: int, dp_size: int
) -> list[list[list[int]]]:
    """Token-budgeted plan: balance sequences across ranks by tokens, first-fit-decreasing bin packing per rank
    under `max_tokens_per_micro_batch`, then split bins on ranks with fewer so all ranks have as many micro-batches.

    A sequence longer than the budget raises ValueError naming its index, its length, the budget and
    `trainer.max_tokens_per_micro_batch`.
    """
    lengths = _check_lengths(seq_lengths, max_tokens_per_micro_batch, dp_size)
    per_rank = [first_fit_decreasing(r, lengths, max_tokens_per_micro_batch) for r in balance_ranks(lengths, dp_size)]
    count = max(len(bins) for bins in per_rank)
    plan = [equalize_bin_count(bins, lengths, count) for bins in per_rank]
    return [[sorted(members) for members in bins] for bins in plan]


def plan_padded_micro_batches(num_seqs: int, micro_batch_size: int, dp_size: int) -> list[list[list[int]]]:
    """Fixed-size plan for packing off: contiguous shares per rank (sizes differ by at most one), cut into
    micro-batches of `micro_batch_size` sequences; a rank with a smaller share ends with a short or empty one."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if num_seqs < 0:
        raise ValueError(f"num_seqs must be >= 0, got {num_seqs}")
    base, extra = divmod(num_seqs, dp_size)
    count = -(-(base + (extra > 0)) // micro_batch_size)
    plan, start = [], 0
    for rank in range(dp_size):
        share = list(range(start, start + base + (rank < extra)))
        start += len(share)
        plan.append([share[k * micro_batch_size : (k + 1) * micro_batch_size] for k in range(count)])
    return plan
