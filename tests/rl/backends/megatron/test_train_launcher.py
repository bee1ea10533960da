"""End to end through the real launcher (Ray workers, one gloo group): `--strategy=megatron` with TP=2 takes the same
first step as fsdp2 on the tiny job, writes a checkpoint that converts to HF, and exports HF weights that load."""

import os

import pytest
from transformers import AutoModelForCausalLM

from rl.trainer.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

# As in tests/rl/trainer/test_trainer_parity.py: a non-zero first-step gradient over the whole loss.
NONZERO = ["data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true"]
COMPARED = ("loss", "pg_loss", "entropy", "grad_norm", "kl")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _first_step(run_dir: str, job, strategy: str, extra=()) -> dict:
    overrides = [*job.overrides(steps=1), *NONZERO, *extra, f"trainer.strategy={strategy}",
                 "trainer.placement.policy_num_gpus_per_node=2"]
    result = run_train(run_dir, overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return next(row for row in read_metrics(f"{run_dir}/metrics.jsonl") if row["step"] == 1)


def test_megatron_tp2_first_step_matches_fsdp2_and_exports(job, tmp_path):
    from rl.backends.megatron.hf_io import megatron_checkpoint_to_hf

    reference = _first_step(str(tmp_path / "fsdp2"), job, "fsdp2", ["trainer.kernels=torch"])
    run_dir = str(tmp_path / "megatron")
    got = _first_step(run_dir, job, "megatron", ["trainer.policy.megatron_config.tensor_model_parallel_size=2",
                                                 "trainer.ckpt_interval=1", "trainer.hf_save_interval=1"])
    assert got["reward_mean"] == reference["reward_mean"], "generation must not depend on the training backend"
    assert reference["grad_norm"] > 0
    for key in COMPARED:
        assert got[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), key
    exported = AutoModelForCausalLM.from_pretrained(os.path.join(run_dir, "exports", "global_step_1"))
    megatron_checkpoint_to_hf(os.path.join(run_dir, "checkpoints", "global_step_1"), str(tmp_path / "ckpt_hf"))
    converted = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt_hf"))
    for (name, a), b in zip(exported.state_dict().items(), converted.state_dict().values(), strict=True):
        assert a.equal(b), name
