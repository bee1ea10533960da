"""The launcher on one GPU: the tiny job trains for two steps with each strategy (nccl worker, generation engine on
the same device and offloaded while the worker trains), and its Hugging Face export loads in transformers; and with
a colocated vLLM engine."""

import math
import os

import pytest
import torch

from rl.trainer.metrics import read_metrics
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
    CUDA IPC, and at step 2 it samples from the weights step 1 trained (its logprobs are the trainer's)."""
    run_dir = str(tmp_path / "vllm")
    result = run_train(run_dir, [*job.overrides(steps=STEPS), "generator.backend=vllm",
                                 "generator.gpu_memory_utilization=0.3", "data.reward_fn=gsm8k_flexible",
                                 "trainer.algorithm.use_entropy_loss=true", "trainer.policy.optimizer_config.lr=1e-2"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "weight sync: ipc" in result.stdout
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    for row in rows:
        assert row["sync_buckets"] >= 1 and row["rollout_logprob_abs_diff_max"] < 1e-2, row
