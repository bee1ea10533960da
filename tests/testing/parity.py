"""Launcher parity: a few steps of the tiny job through the real launcher (Ray actors, one gloo group) under one
layout, and the comparison of a run with fsdp2 on one worker (packed, fp32) over the same steps.

A layout is (strategy, workers, packed, extra overrides). Step 1's rollouts come before any update, so they are
identical across layouts; later rollouts are sampled from weights that differ only by floating-point summation order,
which at these sizes never changes a sampled token, so rewards must match exactly. Loss, its parts and the gradient
norm may differ by summation order: relative 1e-4 (measured: at most a few 1e-6). Final weights (the Hugging Face
export after the last step) by `tolerances.assert_adam_runs_within`: every element within Adam's worst-case drift over
the run's optimizer steps (a gradient within its rounding noise of zero can flip its update's sign), and in every
tensor all but a share OUTLIER_SHARE within the drift of an element whose gradient is well above its rounding noise
(`gradient_rtol`). Measured across layouts: median gap 1e-9 (the weights' last bit), the largest 1.94e-5 (megatron
TP=2: 26 of 529,024 elements beyond 1e-6, 2 beyond 1e-5), against a bulk bound of ~1e-5 at the job's lr and a drift
bound of 1.2e-2; the reference moves its median element by ~2.6e-3.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import pytest
import torch
from safetensors.torch import load_file

from rl.trainer.state.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.tiny_job import TinyJob, run_train

STEPS = 3
# A random model rarely earns the strict reward: the flexible verifier and an entropy bonus make every step's
# gradient non-zero, so the comparison covers the whole loss.
NONZERO = ("data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true")
COMPARED = ("loss", "pg_loss", "entropy", "grad_norm", "kl")
BETAS = (0.9, 0.999)  # the optimizer's default; no layout overrides it
REFERENCE = ("fsdp2", 1, True, ())
# Two mini-batches per rollout batch (8 of the 16 sequences each): the second is trained on weights the first
# already moved, so its importance ratios leave 1 and the clipped surrogate clips. A graded reward (`length_reward`)
# gives non-zero advantages, without which no token can be clipped. At the job's lr (1e-3) and the default clip range
# (eps_clip_low = eps_clip_high = 0.2) that clips a few to 15% of a step's tokens (pg_clipfrac, averaged over the two
# mini-batches; measured 0.06-0.15 per step), so neither needs changing.
MINI_BATCHES = ("trainer.policy_mini_batch_size=2", "data.reward_fn=tests.testing.graded_rewards:length_reward")
CLIPPING = ("pg_clipfrac", "ppo_kl")  # compared as well where the ratio leaves 1

Steps = dict[int, dict]
Weights = dict[str, torch.Tensor]


class Run(NamedTuple):
    steps: Steps
    weights: Weights
    lr: float
    optimizer_steps: int  # rollout steps x mini-batches per rollout batch
    mini_batch_sequences: int  # sequences in one optimizer step's batch


def override(overrides: list[str], key: str) -> str:
    """The value the last `key=value` in `overrides` sets (the launcher's rule: later overrides win)."""
    values = [arg.split("=", 1)[1] for arg in overrides if arg.split("=", 1)[0] == key]
    assert values, f"{key} is not set"
    return values[-1]


def run_layout(run_dir: str, job: TinyJob, layout, steps: int = STEPS) -> Run:
    """Per-step metrics, the final exported weights and the optimizer's settings of one run of `layout`."""
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
    assert not any(arg.startswith("trainer.policy.optimizer_config.betas") for arg in overrides)
    batch, mini_batch = (int(override(overrides, f"trainer.{key}")) for key in ("train_batch_size",
                                                                                  "policy_mini_batch_size"))
    assert batch % mini_batch == 0
    samples = int(override(overrides, "generator.n_samples_per_prompt"))
    return Run(rows, weights, float(override(overrides, "trainer.policy.optimizer_config.lr")),
               steps * batch // mini_batch, mini_batch * samples)


def gradient_rtol(job: TinyJob, run: Run) -> float:
    """`tolerances.network_rtol` of the job's float32 forward and backward, as in test_lora's `_float32_rtol`: the
    loss and weight-gradient sums over a mini-batch's tokens (at most its sequences x the model's positions), the
    vocabulary's softmax, the final norm and tied head, and per layer two norms and four projections over the hidden
    size, the MLP's inner size, a head's width, and the attention's softmax and weighted sum over the longest
    sequence. It bounds a gradient element's gap between two layouts relative to the sum of its terms' magnitudes:
    relative to the element itself for every element whose terms do not cancel."""
    with open(os.path.join(job.model_path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    positions = config["max_position_embeddings"]
    reductions = tolerances.decoder_reductions(config, positions, run.mini_batch_sequences * positions)
    return tolerances.network_rtol(reductions, torch.float32)


def outlier_share(job: TinyJob, run: Run) -> float:
    """The share of a tensor's elements allowed beyond the bulk bound: those whose gradient lies within its rounding
    gap of zero in some optimizer step. That gap is at most `gradient_rtol` x the gradient's scale; with the
    gradient's values spread no more densely near zero than evenly over their range, a step puts at most that share
    of elements within it, so at most optimizer_steps x gradient_rtol over the run (~3e-3 for the tiny job). A wrong
    shard merge, a wrong learning rate or a gradient left out moves most elements of a tensor, not such a share."""
    return run.optimizer_steps * gradient_rtol(job, run)


def assert_same_run(want: Run, got: Run, job: TinyJob, label: str, compared=COMPARED) -> float:
    """`got` took the steps of `want`: the same rewards, the same `compared` metrics up to summation order, and final
    weights within Adam's bounds of `want`'s (`tolerances.assert_adam_runs_within`), which moved well beyond the bulk
    bound. Returns the largest weight difference."""
    want_steps, want_weights, got_steps, got_weights = want.steps, want.weights, got.steps, got.weights
    assert (got.lr, got.optimizer_steps, got.mini_batch_sequences) == (
        want.lr, want.optimizer_steps, want.mini_batch_sequences), "the runs must take the same optimizer steps"
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
    rtol, share = gradient_rtol(job, want), outlier_share(job, want)
    outliers = tolerances.assert_adam_runs_within(got_weights, want_weights, want.lr, want.optimizer_steps, rtol,
                                                  share, BETAS, msg=label)
    print(f"{label}: largest final-weight difference {largest:.3g}; at most {outliers} elements of a tensor beyond "
          f"the bulk bound (gradient rtol {rtol:.2g}, {share:.2g} of each tensor allowed)")
    # A learning rate off by 2% moves each element ~2% of its movement away from the reference: beyond the bulk
    # bound wherever the reference moved by over 100x it, which must be most elements (far more than `share`).
    initial = initial_weights(job)
    names = sorted(want_weights.keys() & initial)
    moved = torch.cat([(want_weights[n].double() - initial[n].double()).abs().flatten() for n in names])
    bulk = torch.cat([tolerances.adam_bulk_gap(want_weights[n], want.lr, want.optimizer_steps, rtol, torch.float32,
                                               BETAS).flatten() for n in names])
    far = float((moved > 100 * bulk).double().mean())
    assert far > max(0.5, 10 * share), f"the steps must move most weights well beyond the bulk bound ({far:.3g})"
    return largest


def initial_weights(job: TinyJob) -> Weights:
    """The job's model before any step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(job.model_path)
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def assert_clipped(steps: Steps) -> None:
    """The run's importance ratios left 1 and the clipped surrogate clipped tokens in some step."""
    assert any(row["ppo_kl"] != 0 for row in steps.values()), "the ratio never left 1"
    assert any(row["pg_clipfrac"] > 0 for row in steps.values()), "no token was clipped"


def run_mini_batch_reference(run_dir: str, job: TinyJob) -> Run:
    """The reference layout with MINI_BATCHES, checked to have clipped."""
    strategy, workers, packed, extra = REFERENCE
    run = run_layout(run_dir, job, (strategy, workers, packed, (*extra, *MINI_BATCHES)))
    assert_clipped(run.steps)
    return run
