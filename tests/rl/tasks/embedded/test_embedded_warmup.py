"""Supervised warm-up: the loss falls, a seed fixes the run, the model beats chance; batched greedy decoding
matches one-prompt-at-a-time decoding."""

import pytest
import torch

from rl.core.rewards import REWARD_FUNCTIONS
from rl.tasks import rewards as _task_rewards  # noqa: F401  (registers the tasks' reward functions)
from rl.tasks.embedded.model import build_model, tiny_model_config
from rl.tasks.embedded.task import TaskSpec, make_task_rows
from rl.tasks.embedded.tokenizer import build_tokenizer
from rl.tasks.embedded.warmup import careless_demonstrations, generate_responses, greedy_accuracy, sft_warmup

# A small problem space (operands 10..29, drawn uniformly) that the model learns in a few seconds.
SPEC = TaskSpec(min_operand=10, max_operand=29, carry_share=None)
STEPS, LR, BATCH, MAX_NEW_TOKENS = 120, 3e-3, 32, 24


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def rows():
    return make_task_rows(150, 0, "train", SPEC), make_task_rows(24, 0, "validation", SPEC)


@pytest.fixture(scope="module")
def trained(tokenizer, rows):
    torch.set_num_threads(1)
    model = build_model(tiny_model_config(tokenizer), seed=0)
    metrics = sft_warmup(model, tokenizer, rows[0], STEPS, LR, BATCH, seed=0)
    return model, metrics


def test_loss_falls(trained):
    _, metrics = trained
    losses = metrics["losses"]
    assert len(losses) == STEPS and metrics["loss_first"] == losses[0]
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10


def test_the_same_seed_repeats_the_run(tokenizer, rows):
    runs = []
    for _ in range(2):
        model = build_model(tiny_model_config(tokenizer), seed=4)
        runs.append(sft_warmup(model, tokenizer, rows[0], 6, LR, 8, seed=4)["losses"])
    other = sft_warmup(build_model(tiny_model_config(tokenizer), seed=4), tokenizer, rows[0], 6, LR, 8, seed=5)
    assert runs[0] == runs[1]
    assert other["losses"] != runs[0]


def test_warmed_up_model_beats_chance_on_unseen_problems(tokenizer, rows, trained):
    model, _ = trained
    # A random guess among the 39 possible sums of this problem space is right 1 time in 39.
    assert greedy_accuracy(model, tokenizer, rows[1], max_new_tokens=MAX_NEW_TOKENS) >= 0.2


def test_batched_greedy_decoding_matches_unbatched(tokenizer, rows, trained):
    model, _ = trained
    sample = rows[1][:12]
    batched = generate_responses(model, tokenizer, sample, max_new_tokens=MAX_NEW_TOKENS)
    single = [generate_responses(model, tokenizer, [row], max_new_tokens=MAX_NEW_TOKENS)[0] for row in sample]
    assert batched == single
    reward = REWARD_FUNCTIONS.get("gsm8k")
    expected = sum(reward(text, row["answer"]) for text, row in zip(single, sample, strict=True)) / len(sample)
    assert greedy_accuracy(model, tokenizer, sample, max_new_tokens=MAX_NEW_TOKENS) == expected


def test_careless_demonstrations_forget_the_carry_in_a_seeded_share(rows):
    train = rows[0]
    careless = careless_demonstrations(train, 0.75, seed=1)
    carrying = [position for position, row in enumerate(train) if row["carries"]]
    forgotten = [p for p in carrying if careless[p]["reference_response"] != train[p]["reference_response"]]
    assert len(forgotten) == round(0.75 * len(carrying))
    assert all(careless[p]["reference_response"] == train[p]["careless_response"] for p in forgotten)
    untouched = [p for p in range(len(train)) if p not in set(forgotten)]
    assert all(careless[p] == train[p] for p in untouched)
    assert careless == careless_demonstrations(train, 0.75, seed=1)
    assert careless != careless_demonstrations(train, 0.75, seed=2)
    with pytest.raises(ValueError, match="forget_rate"):
        careless_demonstrations(train, 1.5, seed=1)
