"""End to end through the real launcher (Ray workers, one gloo group): `--strategy=megatron` with TP=2 trains a step
of the tiny job, writes a checkpoint that converts to HF and exports HF weights that load, equal to the conversion.
Its steps against fsdp2's on one worker are the parity suite's: TP=2 x PP=2 in test_parity_minibatch, TP=2 with a
critic in test_critic_training, TP=2 with LoRA in test_lora_training."""

import os

import pytest
from transformers import AutoModelForCausalLM

from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

# As in tests/testing/parity.py: a non-zero first-step gradient over the whole loss.
NONZERO = ["data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _first_step(run_dir: str, job, strategy: str, extra=()) -> dict:
    overrides = [*job.overrides(steps=1), *NONZERO, *extra, f"trainer.strategy={strategy}",
                 "trainer.placement.policy_num_gpus_per_node=2"]
    result = run_train(run_dir, overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return next(row for row in read_metrics(f"{run_dir}/metrics.jsonl") if row["step"] == 1)


def test_megatron_tp2_checkpoint_converts_to_its_export(job, tmp_path):
    from rl.backends.megatron.hf_io import megatron_checkpoint_to_hf

    run_dir = str(tmp_path / "megatron")
    got = _first_step(run_dir, job, "megatron", ["trainer.policy.megatron_config.tensor_model_parallel_size=2",
                                                 "trainer.ckpt_interval=1", "trainer.hf_save_interval=1"])
    assert got["grad_norm"] > 0
    exported = AutoModelForCausalLM.from_pretrained(os.path.join(run_dir, "exports", "global_step_1"))
    megatron_checkpoint_to_hf(os.path.join(run_dir, "checkpoints", "global_step_1"), str(tmp_path / "ckpt_hf"))
    converted = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt_hf"))
    for (name, a), b in zip(exported.state_dict().items(), converted.state_dict().values(), strict=True):
        assert a.equal(b), name
