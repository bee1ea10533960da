"""The parity contract, end to end through the real launcher (Ray actors, one gloo group): every strategy, with 1 and
2 workers, packed (and padded on 1), runs the same few steps as fsdp2 on 1 worker with packing (fp32), and ends with the
same weights; so do fsdp2 and megatron with the fused chunked loss (`trainer.policy.use_fused_kernels`), and fsdp2
and fsdp with Ulysses over both workers (`trainer.policy.sequence_parallel_size=2`), and megatron with context
parallelism (`megatron_config.context_parallel_size=2`). Any
backend added later joins LAYOUTS.

Step 1's rollouts come before any update, so they are identical across layouts; later rollouts are sampled from
weights that differ only by floating-point summation order, which at these sizes never changes a sampled token, so
rewards must match exactly. Loss, its parts and the gradient norm may differ by summation order: relative 1e-4
(measured: at most a few 1e-6). Final weights (the Hugging Face export after the last step) within 2e-5 absolute
(measured: at most a few 1e-7; three AdamW steps at lr 1e-3 move a weight by up to 3e-3).
"""

import itertools
import os

import pytest
import torch
from safetensors.torch import load_file

from rl.trainer.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

STEPS = 3
# A random model rarely earns the strict reward: the flexible verifier and an entropy bonus make every step's
# gradient non-zero, so the comparison covers the whole loss.
NONZERO = ["data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true"]
COMPARED = ("loss", "pg_loss", "entropy", "grad_norm", "kl")
WEIGHT_ATOL = 2e-5
ZERO3 = ("deepspeed_config.train.zero_optimization.stage=3",)
FUSED = ("trainer.policy.use_fused_kernels=true",)
ULYSSES = ("trainer.policy.sequence_parallel_size=2",)  # one data-parallel shard split over the two workers
CONTEXT = ("trainer.policy.megatron_config.context_parallel_size=2",)  # megatron's counterpart
REFERENCE = ("fsdp2", 1, True, ())
# Padding is the batch format, the same whatever the number of workers: each strategy runs it on one worker.
LAYOUTS = [
    (strategy, workers, packed, ())
    for strategy, workers, packed in itertools.product(("fsdp2", "fsdp", "deepspeed"), (1, 2), (True, False))
    if (strategy, workers, packed, ()) != REFERENCE and (packed or workers == 1)
] + [("deepspeed", 2, True, ZERO3), ("fsdp2", 2, True, FUSED), ("megatron", 2, True, FUSED),
      ("fsdp2", 2, True, ULYSSES), ("fsdp", 2, True, ULYSSES), ("megatron", 2, True, CONTEXT)]


def _layout_id(layout) -> str:
    strategy, workers, packed, extra = layout
    suffix = {(): "", ZERO3: "-zero3", FUSED: "-fused-loss", ULYSSES: "-ulysses", CONTEXT: "-context-parallel"}[extra]
    return f"{strategy}-{workers}w-{'packed' if packed else 'padded'}{suffix}"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _run(run_dir: str, job, layout) -> tuple[dict[int, dict], dict[str, torch.Tensor]]:
    """Per-step metrics and the final exported weights of one run."""
    strategy, workers, packed, extra = layout
    overrides = [
        *job.overrides(steps=STEPS),
        *NONZERO,
        *extra,
        f"trainer.hf_save_interval={STEPS}",
        f"trainer.strategy={strategy}",
        f"trainer.placement.policy_num_gpus_per_node={workers}",
        f"trainer.use_sample_packing={str(packed).lower()}",
    ]
    result = run_train(run_dir, overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    steps = {row["step"]: row for row in read_metrics(f"{run_dir}/metrics.jsonl") if "loss" in row}
    assert sorted(steps) == list(range(1, STEPS + 1))
    weights = load_file(os.path.join(run_dir, "exports", f"global_step_{STEPS}", "model.safetensors"))
    return steps, weights


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory):
    return _run(str(tmp_path_factory.mktemp("reference")), job, REFERENCE)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[_layout_id(layout) for layout in LAYOUTS])
def test_steps_and_final_weights_match_the_reference(job, reference, tmp_path, layout):
    (want_steps, want_weights), (got_steps, got_weights) = reference, _run(str(tmp_path / "run"), job, layout)
    for step in range(1, STEPS + 1):
        want, got = want_steps[step], got_steps[step]
        assert got["reward_mean"] == want["reward_mean"], f"step {step}: rollouts must not depend on the layout"
        assert want["grad_norm"] > 0
        for key in COMPARED:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), f"step {step} {key}"
    assert got_weights.keys() == want_weights.keys()
    diffs = {name: (got_weights[name] - tensor).abs().max().item() for name, tensor in want_weights.items()}
    print(f"{_layout_id(layout)}: largest final-weight difference {max(diffs.values()):.3g}")
    assert max(diffs.values()) <= WEIGHT_ATOL, sorted(diffs.items(), key=lambda item: -item[1])[:3]
    initial = _initial(job)
    moved = max((want_weights[name] - initial[name]).abs().max().item() for name in want_weights.keys() & initial)
    assert moved > 100 * WEIGHT_ATOL, "the steps must move the weights well beyond the tolerance"


def _initial(job) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(job.model_path)
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}
