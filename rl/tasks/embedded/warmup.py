"""Supervised warm-up on (prompt, reference_response) pairs, and greedy accuracy under the GSM8K verifier."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rl.tasks.gsm8k.rewards import gsm8k_reward

IGNORE_INDEX = -100
WARMUP_RAMP_STEPS = 20


def prompt_text(tokenizer: PreTrainedTokenizerBase, row: dict) -> str:
    """The row's chat prompt rendered with the generation prompt, ready for the response to follow."""
    return tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)


def encode_example(tokenizer: PreTrainedTokenizerBase, row: dict) -> tuple[list[int], list[int]]:
    """(input ids, labels) for prompt + reference response + eos; labels are IGNORE_INDEX on the prompt."""
    if "reference_response" not in row:
        raise KeyError(f"row {row.get('index')} has no 'reference_response'; the warm-up needs one per row")
    prompt = tokenizer(prompt_text(tokenizer, row), add_special_tokens=False)["input_ids"]
    response = tokenizer(row["reference_response"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt + response, [IGNORE_INDEX] * len(prompt) + response


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / labels tensors."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for position, (example_ids, example_labels) in enumerate(examples):
        ids[position, : len(example_ids)] = torch.tensor(example_ids)
        labels[position, : len(example_labels)] = torch.tensor(example_labels)
        mask[position, : len(example_ids)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def learning_rate(step: int, lr: float) -> float:
    """Linear warm-up over the first WARMUP_RAMP_STEPS steps, then constant: a run of N steps is the first N steps
    of any longer run with the same seed."""
    return lr * min(1.0, (step + 1) / WARMUP_RAMP_STEPS)


def careless_demonstrations(rows: Sequence[dict], forget_rate: float, seed: int) -> list[dict]:
    """Copies of `rows` as a careless demonstrator answers them: among the rows whose problem carries, a seeded
    `forget_rate` share get their `careless_response` (the carry forgotten) as `reference_response`.

    A model imitating it forgets most carries when decoding greedily yet still writes some, which gives RL,
    rewarded on the final answer only, a behaviour to reinforce.
    """
    if not 0.0 <= forget_rate <= 1.0:
        raise ValueError(f"forget_rate must lie in [0, 1], got {forget_rate}")
    carrying = [position for position, row in enumerate(rows) if row["carries"]]
    forgotten = set(random.Random(f"careless/{seed}").sample(carrying, round(forget_rate * len(carrying))))
    return [
        {**row, "reference_response": row["careless_response"]} if position in forgotten else row
        for position, row in enumerate(rows)
    ]


def sft_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> dict[str, object]:
    """Train `model` in place for `steps` AdamW steps on the rows' reference responses (loss on response tokens).

    Batches are drawn by a seeded shuffle, so the same (model weights, rows, settings, seed) give the same run.
    `on_step(step, loss)`, when given, is called after each optimizer step (1-based step).
    Returns {"steps", "losses" (one per step), "loss_first", "loss_last", "seconds"}.
    """
    if steps < 1 or batch_size < 1 or not rows:
        raise ValueError(
            f"sft_warmup needs steps >= 1, batch_size >= 1 and rows, got {steps}, {batch_size}, {len(rows)}"
        )
    examples = [encode_example(tokenizer, row) for row in rows]
    order_rng = random.Random(f"sft-warmup/{seed}")
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    losses, order, start = [], [], time.perf_counter()
    for step in range(steps):
        if len(order) < batch_size:
            order.extend(order_rng.sample(range(len(examples)), len(examples)))
        batch = collate([examples[i] for i in order[:batch_size]], tokenizer.pad_token_id)
        del order[:batch_size]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, lr)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step + 1, losses[-1])
    model.eval()
    seconds = time.perf_counter() - start
    return {"steps": steps, "losses": losses, "loss_first": losses[0], "loss_last": losses[-1], "seconds": seconds}


@torch.no_grad()
def generate_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    max_new_tokens: int,
    batch_size: int = 256,
) -> list[str]:
    """Greedy responses (special tokens removed) for each row's prompt, generated in left-padded batches."""
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    responses: list[str] = []
    try:
        for begin in range(0, len(rows), batch_size):
            texts = [prompt_text(tokenizer, row) for row in rows[begin : begin + batch_size]]
            batch = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
            output = model.generate(
                **batch,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            responses.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return responses


def greedy_accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict], max_new_tokens: int
) -> float:
    """Share of rows whose greedy response the strict GSM8K verifier scores 1.0."""
    responses = generate_responses(model, tokenizer, rows, max_new_tokens)
    return sum(gsm8k_reward(response, row["answer"]) for response, row in zip(responses, rows, strict=True)) / len(rows)
