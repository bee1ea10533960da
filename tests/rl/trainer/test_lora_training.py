"""LoRA through the launcher (every strategy, the HF engine): a run's exports are a PEFT adapter folder that
PEFT loads and merged weights that transformers loads to the same logits, and a run resumed from its adapter
checkpoint logs what the uninterrupted run logged."""

import json
import os
import shutil

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from rl.trainer.state.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.tiny_job import make_tiny_job, run_train

STEPS = 3
LORA = ["trainer.policy.model.lora.rank=8", "trainer.policy.model.lora.alpha=16",
        "trainer.policy.optimizer_config.lr=1e-2", "data.reward_fn=gsm8k_flexible",
        "trainer.algorithm.use_entropy_loss=true"]
COMPARED = ("reward_mean", "loss", "pg_loss", "grad_norm", "kl", "entropy")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


EXPORTED = [f"trainer.hf_save_interval={STEPS}", "trainer.policy.model.lora.merge_on_export=true"]


def _assert_exports(job, run_dir: str) -> None:
    """The run's last export is a PEFT adapter folder that PEFT loads, and merged weights that transformers loads to
    the adapted model's logits. (Each strategy's adapters and merged weights are checked against PEFT in its own
    backend test: tests/rl/backends/test_lora.py, tests/rl/backends/megatron/test_lora.py; here the worker's export
    path.)"""
    export = os.path.join(run_dir, "exports", f"global_step_{STEPS}")
    with open(os.path.join(export, "adapter_config.json")) as f:
        config = json.load(f)
    assert config["r"] == 8 and config["lora_alpha"] == 16 and config["peft_type"] == "LORA"
    base = AutoModelForCausalLM.from_pretrained(job.model_path, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, export).eval()
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(export, "merged"), dtype=torch.float32).eval()
    ids = torch.randint(3, 30, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = adapted(ids).logits
        got = merged(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(job.model_path, dtype=torch.float32).eval()(ids).logits
    # Merged, each adapted projection is x (W + s B A) with W + s B A rounded per element (a sum of the rank's
    # products, W and the scaling: rank + 2 more terms); adapted, x W + s (x A) B: the same sums in other orders, so
    # the logits agree within the network's float32 bound with the adapters' two reductions and the merge's on each
    # of a layer's four projections in a row (q/k/v, o, gate/up, down).
    config = base.config
    reductions = (tolerances.decoder_reductions(config, ids.shape[1], 0, 8)
                  + [8 + 2] * 4 * config.num_hidden_layers)
    gap = tolerances.network_rtol(reductions, torch.float32) * float(want.abs().max())
    tolerances.assert_within(got, want, gap, "merged export's logits")
    moved = float((want - plain).abs().max())
    assert moved > gap, f"{STEPS} steps at lr 1e-2 moved the adapters: max |change| {moved:.3g} <= rounding {gap:.3g}"


@pytest.fixture(scope="module")
def one_worker(job, tmp_path_factory) -> tuple[str, dict[int, dict]]:
    """The LoRA job on fsdp2 and one worker, a checkpoint every step and exports at the end: what the other runs are
    compared with (its run dir and per-step metrics)."""
    run_dir = str(tmp_path_factory.mktemp("lora-fsdp2-1w"))
    result = run_train(run_dir, [*job.overrides(steps=STEPS), *LORA, *EXPORTED, "trainer.ckpt_interval=1"])
    assert result.returncode == 0, result.stderr[-5000:]
    return run_dir, {r["step"]: r for r in read_metrics(os.path.join(run_dir, "metrics.jsonl"))}


def _assert_same_steps(run_dir: str, expected: dict[int, dict], exact: bool = False) -> None:
    """`exact`: the same layout resumed from a checkpoint (the adapters, Adam's state, the data order and the
    sampling seeds restored exactly, then the same operations in the same order), so every metric is identical."""
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        want = expected[row["step"]]
        assert row["reward_mean"] == want["reward_mean"], row["step"]  # same rollouts: same sampled tokens
        for key in COMPARED:
            if exact:
                assert row[key] == want[key], (row["step"], key, row[key], want[key])
            else:
                assert row[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (row["step"], key)


def test_exports_are_a_peft_adapter_and_merged_weights(job, one_worker):
    _assert_exports(job, one_worker[0])


def test_resume_from_an_adapter_checkpoint_continues_exactly(job, tmp_path, one_worker):
    """The run as it stood after step 2 (its checkpoints up to step 2; the rows it logged after are dropped by the
    resume), resumed: step 3 again, exactly."""
    run_dir, expected = one_worker
    resumed = str(tmp_path / "resumed")
    shutil.copytree(run_dir, resumed, ignore=shutil.ignore_patterns("ray", "exports", f"global_step_{STEPS}"))
    result = run_train(resumed, [*job.overrides(steps=STEPS), *LORA, "trainer.ckpt_interval=1",
                                 "trainer.resume_mode=latest"])
    assert result.returncode == 0, result.stderr[-5000:]
    assert f"global_step_{STEPS - 1} (step {STEPS - 1})" in result.stdout
    _assert_same_steps(resumed, expected, exact=True)


@pytest.mark.parametrize("strategy,workers,extra", [
    ("fsdp2", 2, ()), ("deepspeed", 2, ("deepspeed_config.train.zero_optimization.stage=3",)),
    ("megatron", 2, ("trainer.policy.megatron_config.tensor_model_parallel_size=2",)),
], ids=["fsdp2-2w", "zero3-2w", "megatron-tp2-2w"])
def test_the_same_lora_job_through_every_layout(job, tmp_path, one_worker, strategy, workers, extra):
    """The same steps as the one-worker run, and exports as its. (fsdp's LoRA runs through the launcher in
    test_trainer_options, hybrid-sharded with excluded modules; its adapters against PEFT in backends/test_lora.)"""
    run_dir = str(tmp_path / "run")
    result = run_train(run_dir, [*job.overrides(steps=STEPS), *LORA, *EXPORTED, *extra, f"trainer.strategy={strategy}",
                                 f"trainer.placement.policy_num_gpus_per_node={workers}"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    _assert_same_steps(run_dir, one_worker[1])
    _assert_exports(job, run_dir)
