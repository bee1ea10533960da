"""`rl.launch.dpo` end to end on the embedded preference set (fsdp): from the warmed-up careless model, the training
preference accuracy and the validation preference accuracy, margin and greedy accuracy rise within four steps; the
chosen responses' reward ends above the rejected ones'; a run resumed from the step-2 checkpoint logs
the uninterrupted run's metrics; the export, loaded by transformers, holds the step-4 checkpoint's weights to
the bit; the run directory's config.yaml holds the `dpo:` block. Bad input:
tests/rl/trainer/test_supervised_preflight.py."""

import math

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from transformers import AutoModelForCausalLM

import rl.backends.registry  # noqa: F401  (the strategies the config names)
from rl.core.config import load_config
from rl.core.config.supervised import DpoConfig, split_overrides
from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import run_train
from tests.testing.tolerances import LOG_ROUNDINGS, gamma

COMMON = ["--strategy=fsdp", "trainer.max_steps=4", "trainer.train_batch_size=16", "trainer.eval_interval=4",
          "trainer.eval_before_train=true", "trainer.policy.optimizer_config.lr=3e-4", "trainer.ckpt_interval=2",
          "dpo.beta=0.1", "dpo.sft_loss_weight=1.0", "dpo.sft_average_log_probs=true"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dpo") / "run"
    run_train(str(run_dir), [*COMMON, "trainer.hf_save_interval=4"], module="rl.launch.dpo", check=True)
    return run_dir, read_metrics(str(run_dir / "metrics.jsonl"))


def test_preferences_and_greedy_accuracy_rise(first_run):
    _, rows = first_run
    start, steps = rows[0], {row["step"]: row for row in rows if row["step"] > 0}
    # the policy starts as the reference, and both logprob passes run the same micro-batches through the same
    # weights: every log-ratio is exactly 0. Each pair's -log sigmoid(0) is float32's log of 2 (within
    # LOG_ROUNDINGS u); the sum over the mini-batch's <= 16 pairs, the division by the pairs and the sum over
    # micro-batches and ranks (<= 16 partial sums) round within gamma_(LOG_ROUNDINGS + 34) of ln 2
    assert steps[1]["rewards_chosen"] == steps[1]["rewards_rejected"] == steps[1]["reward_margin"] == 0.0
    gap = gamma(LOG_ROUNDINGS + 2 * 16 + 2, torch.float32) * math.log(2)
    assert abs(steps[1]["dpo_loss"] - math.log(2)) <= gap, steps[1]
    assert steps[4]["preference_accuracy"] > 0.5
    assert steps[4]["val_preference_accuracy"] > start["val_preference_accuracy"]
    assert steps[4]["val_reward_margin"] > 0
    assert steps[4]["val_accuracy"] > start["val_accuracy"]
    assert steps[4]["reward_margin"] > 0 and steps[4]["rewards_chosen"] > steps[4]["rewards_rejected"]


def test_resumed_run_logs_the_uninterrupted_metrics(first_run, tmp_path):
    run_dir, rows = first_run
    run_train(str(tmp_path / "resumed"), [*COMMON, "trainer.eval_before_train=false",
                                          f"trainer.resume_mode={run_dir / 'checkpoints' / 'global_step_2'}"],
              module="rl.launch.dpo", check=True)
    resumed = read_metrics(str(tmp_path / "resumed" / "metrics.jsonl"))
    want = {row["step"]: row for row in rows}
    got = {row["step"]: row for row in resumed}
    assert sorted(got) == [3, 4]
    for step in (3, 4):
        for key in ("dpo_loss", "reward_margin", "grad_norm", "val_reward_margin", "val_accuracy"):
            if key in want[step]:
                assert got[step][key] == want[step][key], (step, key)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the checkpoint is read in this one process
def test_export_holds_the_weights_the_trainer_checkpointed(first_run):
    """The step-4 export as transformers loads it holds, tensor by tensor and to the bit (both are copies of the same
    float32 weights), what the trainer saved in its step-4 checkpoint (the state a resumed run continues from: see
    the resumed run above), read here with torch.distributed.checkpoint; and training moved every tensor from the
    starting model."""
    run_dir = first_run[0]
    exported = AutoModelForCausalLM.from_pretrained(str(run_dir / "exports" / "global_step_4")).state_dict()
    start = AutoModelForCausalLM.from_pretrained(str(run_dir / "embedded" / "model")).state_dict()
    path = str(run_dir / "checkpoints" / "global_step_4")
    listed = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    held = {key.removeprefix("model."): torch.empty(entry.size, dtype=entry.properties.dtype)
            for key, entry in listed.items() if key.startswith("model.") and isinstance(entry, TensorStorageMetadata)}
    dcp.load({"model": held}, checkpoint_id=path, no_dist=True)
    assert held.keys() == exported.keys()
    for name, weight in held.items():
        assert exported[name].dtype == weight.dtype and torch.equal(exported[name], weight), name
        assert not torch.equal(weight, start[name]), f"{name} is the starting model's"



def test_run_config_holds_the_dpo_block(first_run):
    args = split_overrides("dpo", [], str(first_run[0] / "config.yaml"))
    assert args.block == DpoConfig(beta=0.1, sft_loss_weight=1.0, sft_average_log_probs=True)
    cfg = load_config(args.overrides, config_file=args.config_file)
    assert (cfg.trainer.strategy, cfg.trainer.max_steps, cfg.trainer.hf_save_interval) == ("fsdp", 4, 4)
