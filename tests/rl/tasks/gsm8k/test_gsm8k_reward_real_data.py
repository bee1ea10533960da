"""The GSM8K verifier against the published data (read in place beside the repository; skipped when absent, failed
when absent under CI)."""

import json
from pathlib import Path

import pytest

from rl.core.rewards import REWARD_FUNCTIONS
from rl.tasks import rewards as _task_rewards  # noqa: F401  (registers the tasks' reward functions)
from tests.testing.shared_data import shared_file, shared_gsm8k

MODEL_KEYS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")
MIN_LABEL_AGREEMENT = 0.99


@pytest.fixture(scope="module")
def gsm8k_dir() -> Path:
    return shared_gsm8k()


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def reference_number(solution: str) -> str:
    """The final answer computed independently of the verifier: the text after '####', commas dropped."""
    return solution.split("####")[-1].strip().replace(",", "")


@pytest.fixture(scope="module")
def reference_rows(gsm8k_dir) -> list[dict]:
    return read_jsonl(gsm8k_dir / "test.jsonl")


@pytest.fixture(scope="module")
def model_solutions(gsm8k_dir, reference_rows) -> list[dict]:
    rows = read_jsonl(shared_file(gsm8k_dir, "example_model_solutions.jsonl"))
    assert [row["question"] for row in rows] == [row["question"] for row in reference_rows]
    return rows


@pytest.mark.parametrize("name", ["train.jsonl", "test.jsonl"])
@pytest.mark.parametrize("reward_name", ["gsm8k", "gsm8k_flexible"])
def test_every_reference_solution_scores_one(gsm8k_dir, name, reward_name):
    reward = REWARD_FUNCTIONS.get(reward_name)
    rows = read_jsonl(gsm8k_dir / name)
    failures = [
        number
        for number, row in enumerate(rows, start=1)
        if reward(row["answer"], reference_number(row["answer"])) != 1.0
    ]
    assert failures == [], f"{reward_name} rejects the reference solution on lines {failures[:20]} of {name}"


def test_every_reference_solution_fails_against_a_shifted_answer(gsm8k_dir):
    rows = read_jsonl(gsm8k_dir / "test.jsonl")
    strict = REWARD_FUNCTIONS.get("gsm8k")
    wrong = [row for row in rows if strict(row["answer"], str(int(reference_number(row["answer"])) + 1)) != 0.0]
    assert wrong == []


def test_flexible_accepts_every_paper_ground_truth(reference_rows, model_solutions):
    flexible = REWARD_FUNCTIONS.get("gsm8k_flexible")
    failures = [
        index
        for index, (reference, solutions) in enumerate(zip(reference_rows, model_solutions, strict=True))
        if flexible(solutions["ground_truth"], reference_number(reference["answer"])) != 1.0
    ]
    assert failures == [], f"ground_truth rejected at test indices {failures[:20]}"


@pytest.mark.parametrize("model", MODEL_KEYS)
def test_flexible_agrees_with_paper_correctness_labels(reference_rows, model_solutions, model):
    flexible = REWARD_FUNCTIONS.get("gsm8k_flexible")
    disagreements = []
    for index, (reference, solutions) in enumerate(zip(reference_rows, model_solutions, strict=True)):
        verdict = flexible(solutions[model]["solution"], reference_number(reference["answer"])) == 1.0
        if verdict != solutions[model]["is_correct"]:
            disagreements.append(index)
    agreement = 1 - len(disagreements) / len(reference_rows)
    assert agreement >= MIN_LABEL_AGREEMENT, f"{model}: agreement {agreement:.4f}, differs at {disagreements[:20]}"
