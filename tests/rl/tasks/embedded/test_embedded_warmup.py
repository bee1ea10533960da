"""The embedded job's warm-up, an `rl.launch.sft` run on demonstrations: the loss falls and the model beats chance on
unseen problems; batched greedy decoding matches one-prompt-at-a-time decoding; careless demonstrations."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.core.rewards import REWARD_FUNCTIONS
from rl.tasks import rewards as _task_rewards  # noqa: F401  (registers the tasks' reward functions)
from rl.tasks.embedded.model import build_model, save_pretrained_model, tiny_model_config
from rl.tasks.embedded.task import TaskSpec, make_task_rows
from rl.tasks.embedded.tokenizer import build_tokenizer
from rl.tasks.embedded.warmup import (
    RESPONSE_KEY,
    careless_demonstrations,
    generate_responses,
    greedy_accuracy,
    sft_warmup,
)

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
def trained(tokenizer, rows, tmp_path_factory):
    work = tmp_path_factory.mktemp("warmup")
    start = save_pretrained_model(build_model(tiny_model_config(tokenizer), seed=0), tokenizer, work / "untrained")
    run = sft_warmup(work / "sft", start, rows[0], "test", seed=0, steps=STEPS, batch_size=BATCH, lr=LR)
    return AutoModelForCausalLM.from_pretrained(run.export, dtype=torch.float32).eval(), run


def test_loss_falls(trained):
    _, run = trained
    assert len(run.losses) == STEPS
    assert sum(run.losses[-10:]) / 10 < 0.5 * sum(run.losses[:10]) / 10


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
    forgotten = [p for p in carrying if careless[p][RESPONSE_KEY] != train[p][RESPONSE_KEY]]
    assert len(forgotten) == round(0.75 * len(carrying))
    assert all(careless[p][RESPONSE_KEY] == train[p]["careless_response"] for p in forgotten)
    untouched = [p for p in range(len(train)) if p not in set(forgotten)]
    assert all(careless[p] == train[p] for p in untouched)
    assert careless == careless_demonstrations(train, 0.75, seed=1)
    assert careless != careless_demonstrations(train, 0.75, seed=2)
    with pytest.raises(ValueError, match="forget_rate"):
        careless_demonstrations(train, 1.5, seed=1)
