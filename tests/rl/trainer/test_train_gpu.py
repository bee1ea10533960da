"""The launcher on one GPU: the tiny job trains for two steps with each strategy (nccl worker, generation engine on
the same device and offloaded while the worker trains), and its Hugging Face export loads in transformers; and with
a colocated vLLM engine."""

import json
import math
import os

import pytest
import torch

from rl.trainer.state.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.tiny_job import make_tiny_job, run_train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
STEPS = 2


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp", "deepspeed", "megatron"])
def test_tiny_job_trains_on_the_gpu(job, tmp_path, strategy):
    from transformers import AutoModelForCausalLM

    run_dir = str(tmp_path / strategy)
    result = run_train(run_dir, [*job.overrides(steps=STEPS), f"trainer.strategy={strategy}",
                                 f"trainer.hf_save_interval={STEPS}", "data.reward_fn=gsm8k_flexible",
                                 "trainer.algorithm.use_entropy_loss=true"])
    assert result.returncode == 0, result.stderr[-5000:]
    assert "generation: hf engine on cuda" in result.stdout
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    for row in rows:
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"]) and row["grad_norm"] > 0, row
    export = os.path.join(run_dir, "exports", f"global_step_{STEPS}")
    model = AutoModelForCausalLM.from_pretrained(export)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_colocated_vllm_engine_trains_on_the_gpu(job, tmp_path):
    """vLLM on the worker's GPU (placed in its placement group, asleep while it trains): the weights reach it over
    CUDA IPC, and at step 2 it samples from the weights step 1 trained (its logprobs are the trainer's up to float32
    rounding: the trainer computes in float32 here, as the engine does with the tiny job's float32 checkpoint)."""
    run_dir, lr = str(tmp_path / "vllm"), 1e-2
    result = run_train(run_dir, [*job.overrides(steps=STEPS), "generator.backend=vllm",
                                 "generator.gpu_memory_utilization=0.3", "data.reward_fn=gsm8k_flexible",
                                 "trainer.algorithm.use_entropy_loss=true", f"trainer.policy.optimizer_config.lr={lr}",
                                 "trainer.bf16=false"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "weight sync: ipc" in result.stdout
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    gap = _gpu_engine_trainer_gap(job.model_path, lr, STEPS - 1)
    print(f"engine-trainer gaps {[row['rollout_logprob_abs_diff_max'] for row in rows]}, bound {gap:.3g}")
    for row in rows:
        assert row["sync_buckets"] >= 1 and row["rollout_logprob_abs_diff_max"] <= gap, row


TF32_UNIT_ROUNDOFF = 2.0**-11  # TF32 keeps 10 of float32's 23 fraction bits


def _gpu_engine_trainer_gap(model_path: str, lr: float, steps: int) -> float:
    """Largest gap of an engine's and the trainer's logprob of one token at the same weights on a GPU, both in
    float32, for the model at `model_path` after at most `steps` Adam steps at `lr`:
    - the two forwards' float32 sums in other orders: `tolerances.trained_model_logprob_gap`;
    - attention kernels whose float32 dot products take TF32 operands: vLLM's Triton attention (the backend it picks
      for float32 on a GPU; TF32 is Triton's default for float32 dots) and, counted too, PyTorch's memory-efficient
      SDPA (float32 split into TF32 parts). Per layer the scores' q and k and the weighted sum's p and v round once
      each (u = 2^-11), 4 roundings a layer chained to a logit as `tests/rl/backends/test_bf16.py` chains bfloat16's:
      gamma_(4 layers) relative to the largest |logit|, twice for a logprob (a logit less a log-sum-exp of logits),
      twice for the two sides. The largest |logit| is bounded from the weights as `trained_model_logprob_gap` does:
      the final norm's output has L2 norm <= sqrt(hidden) max|gain|, each element moved <= `adam_drift` / 2."""
    from transformers import AutoModelForCausalLM

    with open(os.path.join(model_path, "config.json"), encoding="utf-8") as f:
        layers = json.load(f)["num_hidden_layers"]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    head, gain = model.get_output_embeddings().weight.detach(), model.model.norm.weight.detach()
    hidden, moved = head.shape[1], tolerances.adam_drift(lr, steps) / 2
    largest = float((head.norm(dim=1).max() + moved * hidden**0.5) * (gain.abs().max() + moved) * hidden**0.5)
    k_u = 4 * layers * TF32_UNIT_ROUNDOFF
    tf32 = 2 * 2 * k_u / (1 - k_u) * largest
    return tolerances.trained_model_logprob_gap(model_path, lr, steps) + tf32
