"""A vision-language model through the launcher (fsdp2, the hf engine in the driver): a tiny Qwen2-VL trains on the
embedded visual task's rows for two steps. Images reach every part or the run could not go on (a placeholder
without its image stops the forward); the checks: the vision tower's weights in the step-2 export all moved from
the initial ones (only image sequences give it a gradient), the export loads in transformers with its processor,
and evaluation ran on the images."""

import pytest
import torch
from transformers import AutoModelForImageTextToText

from rl.core.data.parquet_io import write_parquet_atomic
from rl.core.processors import load_processor
from rl.tasks.embedded_vl.model import build_model, build_processor, save_vl_model, tiny_vl_config
from rl.tasks.embedded_vl.task import make_rows
from rl.trainer.metrics import read_metrics
from tests.testing.tiny_job import run_train

# Any reward that varies between samples gives GRPO a gradient: here the digits a response writes.
REWARD = "def digits(response, answer, **_):\n    return sum(c.isdigit() for c in response) / 8\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl")
    processor = build_processor()
    model = save_vl_model(build_model(tiny_vl_config(processor.tokenizer), 0), processor, root / "model")
    write_parquet_atomic(make_rows(16, 0, "train"), root / "train.parquet")
    write_parquet_atomic(make_rows(4, 0, "validation"), root / "val.parquet")
    (root / "reward.py").write_text(REWARD)
    run_dir = root / "run"
    run_train(str(run_dir), [
        f"trainer.policy.model.path={model}", f"data.train_data=['{root / 'train.parquet'}']",
        f"data.val_data=['{root / 'val.parquet'}']", f"data.reward_fn={root / 'reward.py'}:digits",
        "trainer.max_steps=2", "trainer.train_batch_size=4", "trainer.policy_mini_batch_size=4",
        "trainer.micro_train_batch_size_per_gpu=2", "trainer.micro_forward_batch_size_per_gpu=2",
        "generator.n_samples_per_prompt=4", "generator.max_generate_length=12",
        "trainer.policy.optimizer_config.lr=1e-3", "trainer.eval_interval=2", "trainer.ckpt_interval=0",
        "trainer.hf_save_interval=2"], check=True)
    return model, run_dir


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
