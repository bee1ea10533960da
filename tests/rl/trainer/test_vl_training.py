"""The embedded visual job through the launcher (`trainer.policy.model.path=embedded-vl`, its data `[embedded-vl]`;
fsdp2, the hf engine in the driver): its tiny Qwen2-VL, warmed up by an `rl.launch.sft` run on image rows (once per
machine, cached), trains for two steps. Images reach every part or the run could not go on (a placeholder without
its image stops the forward); the checks: the warm-up's SFT run lowered its loss and the run starts from its export,
the vision tower's weights in the step-2 export all moved from the warmed-up ones (only image sequences give it a
gradient), the export loads in transformers with its processor, and evaluation ran on the images."""

import json

import pytest
import torch
from transformers import AutoModelForImageTextToText

from rl.core.processors import load_processor
from rl.trainer.metrics import read_metrics
from tests.testing.tiny_job import run_train

# Any reward that varies between samples gives GRPO a gradient in two steps: here the digits a response writes.
REWARD = "def digits(response, answer, **_):\n    return sum(c.isdigit() for c in response) / 8\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl")
    (root / "reward.py").write_text(REWARD)
    run_dir = root / "run"
    run_train(str(run_dir), [
        "trainer.policy.model.path=embedded-vl", "data.train_data=[embedded-vl]", "data.val_data=[embedded-vl]",
        f"data.reward_fn={root / 'reward.py'}:digits", "trainer.max_steps=2", "trainer.train_batch_size=4",
        "trainer.policy_mini_batch_size=4", "trainer.micro_train_batch_size_per_gpu=2",
        "trainer.micro_forward_batch_size_per_gpu=2", "generator.n_samples_per_prompt=4",
        "trainer.eval_interval=2", "trainer.eval_before_train=false", "trainer.ckpt_interval=0",
        "trainer.hf_save_interval=2"], check=True)
    return run_dir / "embedded-vl" / "model", run_dir


def test_the_warm_up_is_an_sft_run_that_learned(run):
    model, _ = run
    metrics = json.loads((model / "embedded.json").read_text())["metrics"]
    assert metrics["warmup_loss_last"] < metrics["warmup_loss_first"] - 2.0, metrics
    assert 0.0 < metrics["val_accuracy"] < 0.8, "careless: it skips the last quadrant on most such problems"


def test_the_vision_tower_trains_and_the_export_loads_with_its_processor(run):
    model, run_dir = run
    rows = {row["step"]: row for row in read_metrics(str(run_dir / "metrics.jsonl"))}
    assert rows[1]["grad_norm"] > 0 and "val_accuracy" in rows[2]
    initial = AutoModelForImageTextToText.from_pretrained(str(model)).state_dict()
    export = run_dir / "exports" / "global_step_2"
    trained = AutoModelForImageTextToText.from_pretrained(str(export)).state_dict()
    assert set(trained) == set(initial)
    visual = [name for name in initial if name.startswith("model.visual.")]
    assert visual and all(not torch.equal(trained[name], initial[name]) for name in visual), "every vision weight moved"
    assert load_processor(str(export)).image_processor.to_dict() == load_processor(str(model)).image_processor.to_dict()
