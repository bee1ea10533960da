"""The synthetic task: answers recomputed independently, disjoint splits, rows graded by the GSM8K verifier."""

import re

import pytest

from rl.core.data import load_prompt_dataset
from rl.core.rewards import REWARD_FUNCTIONS
from rl.tasks import rewards as _task_rewards  # noqa: F401  (registers the tasks' reward functions)
from rl.tasks.embedded.task import DATA_SOURCE, TaskSpec, make_task_rows, write_task_dataset

QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")
STEP = re.compile(r"(\d+(?:\+\d+)+)=(\d+)")
gsm8k = REWARD_FUNCTIONS.get("gsm8k")


def operands(row):
    match = QUESTION.fullmatch(row["prompt"][0]["content"])
    assert match, row["prompt"]
    return int(match.group(1)), int(match.group(2))


@pytest.fixture(scope="module")
def train_rows():
    return make_task_rows(2000, 3, "train")


@pytest.fixture(scope="module")
def val_rows():
    return make_task_rows(500, 3, "validation")


def test_rows_have_the_prompt_file_layout(train_rows):
    for position, row in enumerate(train_rows):
        assert row["prompt"][0]["role"] == "user" and len(row["prompt"]) == 1
        assert row["data_source"] == DATA_SOURCE
        assert row["index"] == position
        assert isinstance(row["answer"], str)


def test_answers_are_the_sums_of_the_two_operands(train_rows, val_rows):
    for row in train_rows + val_rows:
        left, right = operands(row)
        assert 10 <= left <= 99 and 10 <= right <= 99
        assert int(row["answer"]) == left + right


def column_steps(response):
    body, final = response.split(" #### ")
    steps = STEP.findall(body)
    assert len(steps) == 2, response
    for terms, total in steps:
        assert sum(int(term) for term in terms.split("+")) == int(total), response
    return [terms.split("+") for terms, _ in steps], int(final)


def test_reference_responses_are_correct_column_additions(train_rows):
    for row in train_rows:
        left, right = operands(row)
        (ones_terms, tens_terms), final = column_steps(row["reference_response"])
        assert ones_terms == [str(left % 10), str(right % 10)]
        carry = (left % 10 + right % 10) // 10
        assert tens_terms == [str(left // 10), str(right // 10)] + ([str(carry)] if carry else [])
        assert final == left + right
        assert row["carries"] == bool(carry)


def test_careless_responses_drop_exactly_the_carry(train_rows):
    for row in train_rows:
        left, right = operands(row)
        (ones_terms, tens_terms), final = column_steps(row["careless_response"])
        assert ones_terms == [str(left % 10), str(right % 10)]
        assert tens_terms == [str(left // 10), str(right // 10)]
        assert final == (left // 10 + right // 10) * 10 + (left + right) % 10
        assert (row["careless_response"] == row["reference_response"]) == (not row["carries"])


def test_a_fixed_share_of_rows_carries(train_rows, val_rows):
    assert sum(row["carries"] for row in train_rows) == 1500
    assert sum(row["carries"] for row in val_rows) == 375
    uniform = make_task_rows(2000, 3, "train", TaskSpec(carry_share=None))
    # Uniform operands 10..99: the ones digits carry in 45 of 100 pairs.
    assert 0.40 < sum(row["carries"] for row in uniform) / 2000 < 0.50


def test_the_verifier_accepts_every_reference_and_rejects_corrupted_ones(train_rows, val_rows):
    for row in train_rows + val_rows:
        assert gsm8k(row["reference_response"], row["answer"]) == 1.0
        assert gsm8k(row["careless_response"], row["answer"]) == (0.0 if row["carries"] else 1.0)
        wrong = str(int(row["answer"]) + 1)
        assert gsm8k(row["reference_response"].rsplit(" ", 1)[0] + " " + wrong, row["answer"]) == 0.0
        assert gsm8k(row["reference_response"].replace("####", ""), row["answer"]) == 0.0


def test_splits_are_disjoint_for_any_seeds():
    train = {row["prompt"][0]["content"] for seed in (0, 1) for row in make_task_rows(3000, seed, "train")}
    val = {row["prompt"][0]["content"] for seed in (0, 1) for row in make_task_rows(500, seed, "validation")}
    assert not train & val


def test_rows_are_distinct_and_depend_only_on_the_seed():
    first, again, other = (make_task_rows(300, seed, "train") for seed in (5, 5, 6))
    assert first == again and first != other
    assert len({row["prompt"][0]["content"] for row in first}) == 300


def test_asking_for_more_rows_than_the_split_holds_names_n():
    spec = TaskSpec(min_operand=10, max_operand=12)
    with pytest.raises(ValueError, match=r"n=100 .*validation"):
        make_task_rows(100, 0, "validation", spec)
    with pytest.raises(ValueError, match="split"):
        make_task_rows(1, 0, "test")
    with pytest.raises(ValueError, match="carry_share"):
        TaskSpec(carry_share=1.5)
    with pytest.raises(ValueError, match="max_operand"):
        TaskSpec(max_operand=100)


def test_written_dataset_loads_with_the_prompt_loader(tmp_path):
    train_path, val_path = write_task_dataset(tmp_path / "data", n_train=64, n_val=16, seed=1)
    train, val = load_prompt_dataset([train_path]), load_prompt_dataset([val_path])
    assert (len(train), len(val)) == (64, 16)
    assert {record.messages()[0]["content"] for record in train}.isdisjoint(
        record.messages()[0]["content"] for record in val
    )
    for record in train:
        left, right = (int(value) for value in QUESTION.fullmatch(record.messages()[0]["content"]).groups())
        assert record.answer == str(left + right) and record.data_source == DATA_SOURCE
    assert sorted(path.name for path in (tmp_path / "data").iterdir()) == ["train.parquet", "validation.parquet"]
