"""`rl.launch.dpo` end to end on the embedded preference set (fsdp): from the warmed-up careless model, the training
preference accuracy and the validation preference accuracy, margin and greedy accuracy rise within four steps; the
chosen responses' reward ends above the rejected ones'; a run resumed from the step-2 checkpoint logs
the uninterrupted run's metrics; the export loads in transformers; identical chosen and rejected responses are
refused before Ray starts, naming the row."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.launch.subprocess_run import run_train
from rl.trainer.metrics import read_metrics
from tests.testing.ray_cluster import shared_ray_address

COMMON = ["--strategy=fsdp", "trainer.max_steps=4", "trainer.train_batch_size=16", "trainer.eval_interval=4",
          "trainer.eval_before_train=true", "trainer.policy.optimizer_config.lr=3e-4", "trainer.ckpt_interval=2",
          "dpo.beta=0.1", "dpo.sft_loss_weight=1.0"]


def _launch(run_dir, overrides):
    result = run_train(str(run_dir), [*overrides, f"--ray_address={shared_ray_address()}"], timeout=600,
                       module="rl.launch.dpo")
    assert result.returncode == 0, result.stderr[-3000:]
    return read_metrics(str(run_dir / "metrics.jsonl"))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dpo") / "run"
    return run_dir, _launch(run_dir, [*COMMON, "trainer.hf_save_interval=4"])


def test_preferences_and_greedy_accuracy_rise(first_run):
    _, rows = first_run
    start, steps = rows[0], {row["step"]: row for row in rows if row["step"] > 0}
    # the policy starts as the reference: every log-ratio is 0, the loss ln 2
    assert steps[1]["dpo_loss"] == pytest.approx(0.6931471805599453, rel=1e-6)
    assert steps[4]["preference_accuracy"] > 0.5
    assert steps[4]["val_preference_accuracy"] > start["val_preference_accuracy"]
    assert steps[4]["val_reward_margin"] > 0
    assert steps[4]["val_accuracy"] > start["val_accuracy"]
    assert steps[4]["reward_margin"] > 0 and steps[4]["rewards_chosen"] > steps[4]["rewards_rejected"]


def test_resumed_run_logs_the_uninterrupted_metrics(first_run, tmp_path):
    run_dir, rows = first_run
    resumed = _launch(tmp_path / "resumed", [*COMMON, "trainer.eval_before_train=false",
                                             f"trainer.resume_mode={run_dir / 'checkpoints' / 'global_step_2'}"])
    want = {row["step"]: row for row in rows}
    got = {row["step"]: row for row in resumed}
    assert sorted(got) == [3, 4]
    for step in (3, 4):
        for key in ("dpo_loss", "reward_margin", "grad_norm", "val_reward_margin", "val_accuracy"):
            if key in want[step]:
                assert got[step][key] == want[step][key], (step, key)


def test_export_loads_in_transformers(first_run):
    model = AutoModelForCausalLM.from_pretrained(str(first_run[0] / "exports" / "global_step_4"))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_identical_pair_is_refused_before_ray_starts(tmp_path):
    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "What is 1 + 2?", "chosen": "3", "rejected": "4"},
            {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "4"}]
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    result = run_train(str(tmp_path / "run"), [f"data.train_data=['{data}']", "data.val_data=[]"], timeout=300,
                       module="rl.launch.dpo")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "pairs.jsonl line 2: chosen and rejected responses are identical" in result.stderr
    assert not (tmp_path / "run" / "ray").exists(), "Ray never started"
