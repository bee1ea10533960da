"""The launcher on one GPU: the tiny job trains for two steps with each strategy (nccl worker, generation engine on
the same device and offloaded while the worker trains), and its Hugging Face export loads in transformers."""

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
