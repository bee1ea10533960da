"""data.val_split_size holds out the rows Hugging Face's `train_test_split` holds out (NeMo RL's
`split_validation_size`), checked against the `datasets` library itself."""

import datasets
import pytest

from rl.core.data import DataError, PromptDataset, PromptRecord, split_validation

ROWS = 40


def _prompts(count: int) -> PromptDataset:
    return PromptDataset([PromptRecord(prompt=f"q{i}", answer=str(i), data_source="t", index=i) for i in range(count)],
                         ("train.jsonl",))


@pytest.mark.parametrize("size", [0.05, 0.3, 0.5, 1, 7])
@pytest.mark.parametrize("seed", [42, 7])
def test_the_rows_train_test_split_holds_out(size, seed):
    training, validation = split_validation(_prompts(ROWS), size, seed)
    theirs = datasets.Dataset.from_dict({"prompt": [f"q{i}" for i in range(ROWS)]}).train_test_split(
        test_size=size, seed=seed)
    assert [row.prompt for row in validation] == theirs["test"]["prompt"]
    assert [row.prompt for row in training] == theirs["train"]["prompt"]
    assert validation.files == (f"train.jsonl (validation split of {len(theirs['test'])} rows, seed {seed})",)


@pytest.mark.parametrize("size", [ROWS, 0.99])
def test_a_split_that_leaves_a_side_empty_is_refused(size):
    with pytest.raises(DataError, match=r"data.val_split_size: .* both sides need a row") as error:
        split_validation(_prompts(ROWS), size, 42)
    assert "train.jsonl" in str(error.value)
