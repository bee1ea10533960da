"""Deterministic, resumable batches of prompts: a seeded shuffle per epoch, cut into fixed-size batches.

Epoch `e` visits the dataset in the order `epoch_order(len(dataset), seed, e)`, a permutation that depends only on
(seed, epoch, dataset size), so any process can rebuild it. A `BatchPosition(epoch, index)` names the next prompt to
serve: `index` counts the prompts of that epoch's order already served. Each yielded `PromptBatch` carries the
position after it; saving that position and passing it back to `iter_batches` continues with exactly the next batch.

drop_last=True (the default): every batch holds exactly `batch_size` prompts; the `len(dataset) % batch_size`
prompts left at the end of an epoch's order are skipped for that epoch (the next epoch reshuffles, so a different
tail is skipped), and the epoch has `len(dataset) // batch_size` batches.
drop_last=False: the last batch of an epoch holds the remainder and may be smaller; no prompt is skipped.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from rl.core.data.errors import DataError
from rl.core.data.records import PromptDataset, PromptRecord


@dataclass(frozen=True)
class BatchPosition:
    """Where the iterator stands: the epoch, and how many prompts of that epoch's order were already served."""

    epoch: int = 0
    index: int = 0


@dataclass(frozen=True)
class PromptBatch:
    """A batch of prompts, where it started, and the position to resume from after it."""

    records: tuple[PromptRecord, ...]
    start: BatchPosition
    next_position: BatchPosition

    def __len__(self) -> int:
        return len(self.records)


def epoch_order(num_rows: int, seed: int, epoch: int) -> list[int]:
    """The dataset positions in the order epoch `epoch` visits them; identical across runs and machines."""
    order = list(range(num_rows))
    random.Random(f"prompt-order/{seed}/{epoch}").shuffle(order)
    return order


def iter_batches(
    dataset: PromptDataset,
    batch_size: int,
    seed: int,
    epoch: int = 0,
    index: int = 0,
    *,
    drop_last: bool = True,
    num_epochs: int | None = None,
) -> Iterator[PromptBatch]:
    """Yield batches starting at (epoch, index), epoch after epoch, until epoch `num_epochs` (None: forever).

    See the module docstring for the order and the drop_last rule. Resume by passing a saved
    `PromptBatch.next_position` as (epoch, index).
    """
    _check_arguments(len(dataset), batch_size, epoch, index, drop_last)
    while num_epochs is None or epoch < num_epochs:
        order = epoch_order(len(dataset), seed, epoch)
        end = len(order) - len(order) % batch_size if drop_last else len(order)
        while index < end:
            stop = min(index + batch_size, end)
            after = BatchPosition(epoch, stop) if stop < end else BatchPosition(epoch + 1, 0)
            records = tuple(dataset[position] for position in order[index:stop])
            yield PromptBatch(records=records, start=BatchPosition(epoch, index), next_position=after)
            index = stop
        epoch, index = epoch + 1, 0


def batches_per_epoch(num_rows: int, batch_size: int, drop_last: bool = True) -> int:
    """How many batches one epoch yields."""
    return num_rows // batch_size if drop_last else -(-num_rows // batch_size)


def _check_arguments(num_rows: int, batch_size: int, epoch: int, index: int, drop_last: bool) -> None:
    if batch_size < 1:
        raise DataError(f"batch_size must be at least 1, got {batch_size}")
    if drop_last and batch_size > num_rows:
        raise DataError(
            f"batch_size {batch_size} exceeds the dataset's {num_rows} prompts, so drop_last would yield nothing; "
            "lower the batch size or add prompts"
        )
    if epoch < 0 or not 0 <= index < num_rows:
        raise DataError(
            f"resume position (epoch={epoch}, index={index}) is out of range for a dataset of {num_rows} prompts; "
            "epoch must be >= 0 and index in [0, dataset size)"
        )
