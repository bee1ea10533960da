"""Seeded, resumable prompt batches: coverage per epoch, determinism, drop_last, and exact resumption."""

import itertools

import pytest

from rl.core.data import (
    BatchPosition,
    DataError,
    PromptDataset,
    PromptRecord,
    batches_per_epoch,
    epoch_order,
    iter_batches,
)


def make_dataset(size: int) -> PromptDataset:
    return PromptDataset([PromptRecord(f"p{i}", str(i), "unit", i) for i in range(size)])


def indices(batch) -> list[int]:
    return [record.index for record in batch.records]


def test_each_epoch_without_drop_last_visits_every_prompt_once():
    dataset = make_dataset(10)
    batches = list(iter_batches(dataset, batch_size=3, seed=1, drop_last=False, num_epochs=2))
    assert [len(batch) for batch in batches] == [3, 3, 3, 1, 3, 3, 3, 1]
    for epoch in range(2):
        served = [i for batch in batches if batch.start.epoch == epoch for i in indices(batch)]
        assert sorted(served) == list(range(10))


def test_drop_last_gives_full_batches_and_skips_the_tail():
    dataset = make_dataset(10)
    batches = list(iter_batches(dataset, batch_size=4, seed=1, num_epochs=3))
    assert [len(batch) for batch in batches] == [4] * 6
    for epoch in range(3):
        served = [i for batch in batches if batch.start.epoch == epoch for i in indices(batch)]
        assert len(set(served)) == 8
        assert served == epoch_order(10, seed=1, epoch=epoch)[:8]
    assert batches_per_epoch(10, 4) == 2 and batches_per_epoch(10, 4, drop_last=False) == 3


def test_same_seed_same_batches_and_other_seeds_or_epochs_differ():
    dataset = make_dataset(50)
    first = [indices(b) for b in iter_batches(dataset, 5, seed=7, num_epochs=2)]
    again = [indices(b) for b in iter_batches(dataset, 5, seed=7, num_epochs=2)]
    other_seed = [indices(b) for b in iter_batches(dataset, 5, seed=8, num_epochs=2)]
    assert first == again
    assert first != other_seed
    assert epoch_order(50, 7, 0) != epoch_order(50, 7, 1)
    assert sorted(epoch_order(50, 7, 3)) == list(range(50))


def test_positions_chain_and_roll_over_at_the_epoch_end():
    batches = list(iter_batches(make_dataset(9), batch_size=4, seed=0, num_epochs=2))
    assert [b.start for b in batches] == [
        BatchPosition(0, 0),
        BatchPosition(0, 4),
        BatchPosition(1, 0),
        BatchPosition(1, 4),
    ]
    assert [b.next_position for b in batches] == [
        BatchPosition(0, 4),
        BatchPosition(1, 0),
        BatchPosition(1, 4),
        BatchPosition(2, 0),
    ]


@pytest.mark.parametrize("drop_last", [True, False])
def test_resuming_from_any_saved_position_continues_exactly(drop_last):
    dataset = make_dataset(11)
    run = list(iter_batches(dataset, batch_size=3, seed=5, drop_last=drop_last, num_epochs=3))
    for stop, batch in enumerate(run):
        saved = batch.next_position
        resumed = iter_batches(dataset, 3, 5, saved.epoch, saved.index, drop_last=drop_last, num_epochs=3)
        assert [indices(b) for b in resumed] == [indices(b) for b in run[stop + 1 :]]


def test_without_num_epochs_the_iterator_keeps_going():
    batches = list(itertools.islice(iter_batches(make_dataset(4), batch_size=2, seed=0), 20))
    assert len(batches) == 20
    assert batches[-1].start == BatchPosition(9, 2)


def test_starting_at_a_later_epoch():
    dataset = make_dataset(6)
    full = list(iter_batches(dataset, 2, seed=3, num_epochs=4))
    later = list(iter_batches(dataset, 2, seed=3, epoch=2, num_epochs=4))
    assert [indices(b) for b in later] == [indices(b) for b in full[6:]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"batch_size": 6}, "exceeds the dataset's 5 prompts"),
        ({"batch_size": 2, "index": 5}, "out of range"),
        ({"batch_size": 2, "epoch": -1}, "out of range"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(DataError, match=match):
        next(iter_batches(make_dataset(5), seed=0, **kwargs))


def test_an_empty_dataset_cannot_be_built():
    with pytest.raises(DataError, match="has no rows"):
        PromptDataset([])
