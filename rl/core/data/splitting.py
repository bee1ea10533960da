"""A validation set carved from the training rows (`data.val_split_size`), as NeMo RL's `split_validation_size` and
Hugging Face's `Dataset.train_test_split(test_size, seed)` carve it, so the same seed holds out the same rows."""

from __future__ import annotations

import math

import numpy as np

from rl.core.data.errors import DataError
from rl.core.data.records import PromptDataset


def held_out_count(size: float, rows: int) -> int:
    """Rows held out: a fraction in (0, 1) of the rows, rounded up (train_test_split's rule); a whole number >= 1
    is a count of rows."""
    return math.ceil(size * rows) if size < 1 else int(size)


def split_validation(dataset: PromptDataset, size: float, seed: int) -> tuple[PromptDataset, PromptDataset]:
    """(training rows, validation rows): one permutation of the rows by numpy's default generator seeded with
    `seed`; its first rows are the validation set, the rest the training set, each in the permutation's order."""
    held_out = held_out_count(size, len(dataset))
    if not 1 <= held_out < len(dataset):
        raise DataError(
            f"data.val_split_size: {size} of the {len(dataset)} training rows from {', '.join(dataset.files)} holds "
            f"out {held_out}; both sides need a row: give a fraction in (0, 1) or a count below {len(dataset)}"
        )
    order = np.random.default_rng(seed).permutation(len(dataset))
    where = f"{', '.join(dataset.files)} (validation split of {held_out} rows, seed {seed})"
    validation = PromptDataset([dataset[int(i)] for i in order[:held_out]], (where,))
    training = PromptDataset([dataset[int(i)] for i in order[held_out:]], dataset.files)
    return training, validation


def joined(first: PromptDataset, second: PromptDataset | None) -> PromptDataset:
    """The rows of both, `first`'s before `second`'s."""
    if second is None:
        return first
    return PromptDataset([*first, *second], (*first.files, *second.files))
