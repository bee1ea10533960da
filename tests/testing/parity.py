"""Launcher parity: a few steps of the tiny job through the real launcher (Ray actors, one gloo group) under one
layout, and the comparison of a run with fsdp2 on one worker (packed, fp32) over the same steps.

A layout is (strategy, workers, packed, extra overrides). Step 1's rollouts come before any update, so they are
identical across layouts; later rollouts are sampled from weights that differ only by floating-point summation order,
which at these sizes never changes a sampled token, so rewards must match exactly. Loss, its parts and the gradient
norm may differ by summation order: relative 1e-4 (measured: at most a few 1e-6). Final weights (the Hugging Face
export after the last step) within WEIGHT_ATOL absolute (measured: at most a few 1e-7; three AdamW steps at lr 1e-3
move a weight by up to 3e-3).
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from rl.trainer.metrics import read_metrics
from tests.testing.tiny_job import TinyJob, run_train

STEPS = 3
# A random model rarely earns the strict reward: the flexible verifier and an entropy bonus make every step's
# gradient non-zero, so the comparison covers the whole loss.
NONZERO = ("data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true")
COMPARED = ("loss", "pg_loss", "entropy", "grad_norm", "kl")
WEIGHT_ATOL = 2e-5
REFERENCE = ("fsdp2", 1, True, ())
# Two mini-batches per rollout batch (8 of the 16 sequences each): the second is trained on weights the first
# already moved, so its importance ratios leave 1 and the clipped surrogate clips. A graded reward (`length_reward`)
# gives non-zero advantages, without which no token can be clipped. At the job's lr (1e-3) and the default clip range
# (eps_clip_low = eps_clip_high = 0.2) that clips a few to 15% of a step's tokens (pg_clipfrac, averaged over the two
# mini-batches; measured 0.06-0.15 per step), so neither needs changing.
MINI_BATCHES = ("trainer.policy_mini_batch_size=2", "data.reward_fn=tests.testing.parity:length_reward")
CLIPPING = ("pg_clipfrac", "ppo_kl")  # compared as well where the ratio leaves 1

Steps = dict[int, dict]
Weights = dict[str, torch.Tensor]


def run_layout(run_dir: str, job: TinyJob, layout, steps: int = STEPS) -> tuple[Steps, Weights]:
    """Per-step metrics and the final exported weights of one run of `layout`."""
    strategy, workers, packed, extra = layout
    overrides = [
        *job.overrides(steps=steps),
        *NONZERO,
        *extra,
        f"trainer.hf_save_interval={steps}",
        f"trainer.strategy={strategy}",
        f"trainer.placement.policy_num_gpus_per_node={workers}",
        f"trainer.use_sample_packing={str(packed).lower()}",
    ]
    result = run_train(run_dir, overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = {row["step"]: row for row in read_metrics(f"{run_dir}/metrics.jsonl") if "loss" in row}
    assert sorted(rows) == list(range(1, steps + 1))
    weights = load_file(os.path.join(run_dir, "exports", f"global_step_{steps}", "model.safetensors"))
    return rows, weights


def assert_same_run(want: tuple[Steps, Weights], got: tuple[Steps, Weights], job: TinyJob, label: str,
                    compared=COMPARED, weight_atol: float = WEIGHT_ATOL) -> float:
    """`got` took the steps of `want`: the same rewards, the same `compared` metrics up to summation order, and final
    weights within `weight_atol` of `want`'s, which moved well beyond it. Returns the largest weight difference."""
    (want_steps, want_weights), (got_steps, got_weights) = want, got
    assert sorted(got_steps) == sorted(want_steps)
    for step in sorted(want_steps):
        want_row, got_row = want_steps[step], got_steps[step]
        assert got_row["reward_mean"] == want_row["reward_mean"], f"step {step}: rollouts must not depend on the layout"
        assert want_row["grad_norm"] > 0
        for key in compared:
            assert got_row[key] == pytest.approx(want_row[key], rel=1e-4, abs=1e-6), f"step {step} {key}"
    assert got_weights.keys() == want_weights.keys()
    diffs = {name: (got_weights[name] - tensor).abs().max().item() for name, tensor in want_weights.items()}
    largest = max(diffs.values())
    print(f"{label}: largest final-weight difference {largest:.3g}")
    assert largest <= weight_atol, sorted(diffs.items(), key=lambda item: -item[1])[:3]
    initial = initial_weights(job)
    moved = max((want_weights[name] - initial[name]).abs().max().item() for name in want_weights.keys() & initial)
    assert moved > 100 * weight_atol, "the steps must move the weights well beyond the tolerance"
    return largest


def initial_weights(job: TinyJob) -> Weights:
    """The job's model before any step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(job.model_path)
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def length_reward(response: str, answer: str) -> float:
    """The response's length in characters, capped at 40, over 40: a graded reward that differs within nearly every
    group of a random model's samples, so advantages are non-zero and the clipped surrogate has work to do."""
    return min(len(response), 40) / 40


def assert_clipped(steps: Steps) -> None:
    """The run's importance ratios left 1 and the clipped surrogate clipped tokens in some step."""
    assert any(row["ppo_kl"] != 0 for row in steps.values()), "the ratio never left 1"
    assert any(row["pg_clipfrac"] > 0 for row in steps.values()), "no token was clipped"


def run_mini_batch_reference(run_dir: str, job: TinyJob) -> tuple[Steps, Weights]:
    """The reference layout with MINI_BATCHES, checked to have clipped."""
    strategy, workers, packed, extra = REFERENCE
    run = run_layout(run_dir, job, (strategy, workers, packed, (*extra, *MINI_BATCHES)))
    assert_clipped(run[0])
    return run
