"""The embedded jobs' supervised warm-up, an `rl.launch.sft` run on (prompt, reference_response) demonstrations, and
greedy accuracy under the GSM8K verifier."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rl.tasks.gsm8k.rewards import gsm8k_reward

WARMUP_RAMP_STEPS = 20  # the learning rate's linear ramp at the start of a warm-up
RESPONSE_KEY = "reference_response"  # the demonstrations' response column (`sft.response_key`)


def prompt_text(tokenizer: PreTrainedTokenizerBase, row: dict) -> str:
    """The row's chat prompt rendered with the generation prompt, ready for the response to follow."""
    return tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)


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
        {**row, RESPONSE_KEY: row["careless_response"]} if position in forgotten else row
        for position, row in enumerate(rows)
    ]


@dataclass(frozen=True)
class WarmupRun:
    """What a warm-up's SFT run left: its loss at each step, its last export and how long it took."""

    losses: list[float]
    export: Path
    seconds: float


def sft_warmup(run_dir: Path, model: Path, demonstrations: Sequence[dict], name: str, *, seed: int, steps: int,
               batch_size: int, lr: float) -> WarmupRun:
    """Warm `model` up on `demonstrations` (rows with a prompt and a RESPONSE_KEY response) by an `rl.launch.sft` run in
    `run_dir`: the default strategy (defaults.yaml's, fsdp2) on one worker, AdamW (betas 0.9/0.98, no weight decay,
    gradients clipped at 1) after a WARMUP_RAMP_STEPS linear ramp, one batch of `batch_size` rows per step, no
    evaluation or checkpoints, one export at the last step, fp32 (the same weights on any machine's default).

    One thread: the same weights on every machine of a kernel path (more threads sum in other orders), and no OpenMP
    barrier spinning beside other busy processes (two threads beside one busy core took 223 s instead of 48 s for the
    visual job's warm-up)."""
    from rl.core.data.parquet_io import write_parquet_atomic
    from rl.core.subprocess_run import run_train

    rows = run_dir.parent / f"{run_dir.name}-demonstrations.parquet"
    write_parquet_atomic(list(demonstrations), rows)
    overrides = [f"trainer.policy.model.path={model}", f"data.train_data=['{rows}']", "data.val_data=[]",
                 f"sft.response_key={RESPONSE_KEY}", f"trainer.seed={seed}", f"trainer.max_steps={steps}",
                 f"trainer.train_batch_size={batch_size}", f"trainer.micro_train_batch_size_per_gpu={batch_size}",
                 f"trainer.policy.optimizer_config.lr={lr}",
                 f"trainer.policy.optimizer_config.lr_warmup_steps={WARMUP_RAMP_STEPS}",
                 "trainer.policy.optimizer_config.betas=[0.9,0.98]", "trainer.policy.optimizer_config.weight_decay=0.0",
                 "trainer.policy.optimizer_config.max_grad_norm=1.0", "trainer.eval_interval=0",
                 "trainer.eval_before_train=false", "trainer.ckpt_interval=0", f"trainer.hf_save_interval={steps}",
                 "trainer.bf16=false"]
    start = time.perf_counter()
    result = run_train(str(run_dir), overrides, threads=1, timeout=1800, module="rl.launch.sft")
    if result.returncode != 0:
        raise RuntimeError(f"{name}: the warm-up's SFT run failed ({result.returncode}):\n{result.stderr[-3000:]}")
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as lines:
        losses = [row["sft_loss"] for row in map(json.loads, lines) if "sft_loss" in row]
    return WarmupRun(losses, run_dir / "exports" / f"global_step_{steps}", time.perf_counter() - start)


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
