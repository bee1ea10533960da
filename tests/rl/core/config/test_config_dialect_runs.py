"""Other projects' configs through the launcher, 2 steps on the tiny job: SkyRL's quickstart and its fully-async
example as `key=value` arguments (the tiny job's sizes appended, as a SkyRL user passes extra arguments to the
script), and NeMo RL's 1B megatron recipe as a `--config` file that inherits it with the model, data and prompt files
pointed at the tiny job. One run per path: overrides in SkyRL's spelling (the fully-async one with its own loss,
`rollout_is`), and a NeMo RL file with `defaults:` and `${...}`."""

from __future__ import annotations

import os
import textwrap

import pyarrow.parquet as pq
import pytest
import yaml

import rl.backends.registry  # noqa: F401  (the strategies' blocks are keys of ours)
from rl.core.config.keys import all_keys
from rl.trainer.state.metrics import read_metrics
from tests.rl.core.config.skyrl_scripts import skyrl_args
from tests.rl.core.config.upstream_configs import NEMO_1B_MEGATRON
from tests.testing import tolerances
from tests.testing.tiny_job import make_tiny_job, run_train


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _saved(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "config.yaml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _only_our_keys(tree: dict, prefix: str = "") -> None:
    ours = set(all_keys())
    for name, value in tree.items():
        key = prefix + name
        assert key in ours, f"{key} in config.yaml is not a key of ours"
        if isinstance(value, dict) and not key.endswith(("kwargs", "env_options", "deepspeed_config.train")):
            _only_our_keys(value, key + ".")


def _trained_two_steps(result, run_dir: str) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    steps = [row["step"] for row in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if row.get("step")]
    assert steps[-1] == 2


def test_skyrl_quickstart_trains(job, tmp_path):
    script = skyrl_args(
        "gsm8k",
        DATA_DIR=os.path.dirname(job.train_data),
        NUM_GPUS="1",
        LOGGER="console",
        INFERENCE_BACKEND="hf",
        HOME=str(tmp_path),
    )
    run_dir = str(tmp_path / "run")
    # SkyRL's cosine schedule over the run's optimizer steps (2 steps of one mini-batch): lr, then lr / 2
    cosine = ["trainer.policy.optimizer_config.scheduler=cosine"]
    result = run_train(run_dir, [*script, *job.overrides(steps=2), *cosine])
    _trained_two_steps(result, run_dir)
    rates = [row["lr"] for row in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if "lr" in row]
    assert rates == pytest.approx([1e-3, 5e-4], rel=0, abs=tolerances.lr_schedule_gap(1e-3))
    output = result.stdout + result.stderr
    assert "SkyRL keys read as ours" in output and "trainer.strategy=fsdp is FSDP1" in output
    saved = _saved(run_dir)
    _only_our_keys(saved)
    assert saved["data"]["reward_fn"] == ["gsm8k_skyrl"] and saved["environment"]["env_class"] is None
    assert (saved["trainer"]["strategy"], saved["trainer"]["resume_mode"]) == ("fsdp", "none")
    assert saved["generator"]["weight_sync_backend"] is None and saved["generator"]["max_prompt_length"] == 512


# Each script's own variables sized to this machine, as a user with fewer GPUs sets them, and the HF engine
SKYRL_ON_THIS_MACHINE = {
    "megatron": {"NUM_GPUS": "2", "MEGATRON_TP": "2", "MEGATRON_PP": "1"},
    "lora": {"NUM_GPUS": "1"},
    "multi_turn": {"NUM_GPUS": "1"},
}


@pytest.mark.parametrize("name", sorted(SKYRL_ON_THIS_MACHINE))
def test_skyrl_examples_train(job, tmp_path, name):
    script = skyrl_args(name, DATA_DIR=os.path.dirname(job.train_data), LOGGER="console", INFERENCE_BACKEND="hf",
                        HOME=str(tmp_path), **SKYRL_ON_THIS_MACHINE[name])
    run_dir = str(tmp_path / "run")
    result = run_train(run_dir, [*script, *job.overrides(steps=2)])
    _trained_two_steps(result, run_dir)
    saved = _saved(run_dir)
    _only_our_keys(saved)
    trainer = saved["trainer"]
    if name == "megatron":
        assert trainer["strategy"] == "megatron"
        assert trainer["policy"]["megatron_config"]["tensor_model_parallel_size"] == 2
    elif name == "lora":
        assert (trainer["strategy"], trainer["policy"]["model"]["lora"]["rank"]) == ("fsdp", 32)
    else:
        assert saved["environment"]["env_class"] == "gsm8k_multi_turn"


def test_nemo_1b_megatron_trains(job, tmp_path):
    """NeMo RL's megatron recipe, which reads its dtensor parent (`defaults: grpo_math_1B.yaml`) first: both files'
    keys are read (the parent's alone is loaded in test_config_dialects and test_config_nemo); fsdp2, the parent's
    strategy, is every other launcher test's."""
    # NeMo RL's prompt files, written here: the template's two words are outside the embedded vocabulary, so the
    # trainer's unknown-token warning shows the prompts it encodes were built with it (the task's own are not).
    (tmp_path / "cot.txt").write_text("Please solve:\n{}", encoding="utf-8")
    (tmp_path / "system.txt").write_text("Answer after ####.", encoding="utf-8")
    # the task's rows in ResponseDataset's columns; validation is the recipe's 5% split of them (validation: null)
    train = pq.read_table(job.train_data)
    pq.write_table(train.rename_columns(["input" if n == "prompt" else "output" if n == "answer" else n
                                         for n in train.column_names]), tmp_path / "train.parquet")
    config = tmp_path / "run.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        defaults: {NEMO_1B_MEGATRON}
        policy:
          model_name: {job.model_path}
          generation: {{backend: hf}}
        data:
          train: {{dataset_name: ResponseDataset, data_path: {tmp_path / "train.parquet"}}}
          default: {{prompt_file: {tmp_path / "cot.txt"}, system_prompt_file: {tmp_path / "system.txt"}}}
        """),
        encoding="utf-8",
    )
    run_dir = str(tmp_path / "run")
    sizes = [o for o in job.overrides(steps=2) if not o.startswith(("data.", "trainer.eval_interval"))]
    # and a bound on the workers' collectives (their process groups and megatron-core's take it)
    result = run_train(run_dir, [f"--config={config}", *sizes, "trainer.eval_interval=2",
                                 "trainer.collective_timeout_s=900"])
    _trained_two_steps(result, run_dir)
    output = result.stdout + result.stderr
    assert "NeMo RL keys read as ours" in output and "data.default.prompt_file -> data.prompt_template_file" in output
    assert "are the tokenizer's unknown token" in output  # "Please solve" of the template
    assert (f"data: {train.num_rows - 4} training prompts, 4 validation prompts from {tmp_path / 'train.parquet'} "
            "(validation split of 4 rows, seed 42)") in output  # ceil(0.05 x 64)
    assert "val_accuracy" in read_metrics(os.path.join(run_dir, "metrics.jsonl"))[-1]
    saved = _saved(run_dir)
    _only_our_keys(saved)
    assert saved["trainer"]["strategy"] == "megatron"
    assert saved["data"]["reward_fn"] == ["gsm8k_flexible"]
    assert [saved["data"][key] for key in ("prompt_key", "answer_key", "val_data", "val_split_size")] == [
        "input", "output", [], 0.05]
    assert saved["trainer"]["policy"]["optimizer_config"]["lr_warmup_steps"] == 13
    assert saved["trainer"]["bf16"] is True
    assert (saved["data"]["prompt_template_file"], saved["data"]["system_prompt_file"]) == (
        str(tmp_path / "cot.txt"), str(tmp_path / "system.txt"))


def test_skyrl_fully_async_trains(job, tmp_path):
    """SkyRL's fully-async example: `rollout_is` (the ratio to the engine's logprobs), the geometric sequence mask,
    staleness up to 4, on one training worker and an engine of its own."""
    script = skyrl_args("fully_async", DATA_DIR=os.path.dirname(job.train_data), NUM_INFERENCE_GPUS="1",
                        NUM_POLICY_GPUS="1", LOGGER="console", INFERENCE_BACKEND="hf", HOME=str(tmp_path))
    # its weight sync is NCCL's broadcast, which needs GPUs: gloo's here (preflight says so for nccl on a CPU)
    cpu = ["generator.inference_engine.weight_sync_backend=gloo"]
    run_dir = str(tmp_path / "run")
    result = run_train(run_dir, [*script, *cpu, *job.overrides(steps=2)])
    _trained_two_steps(result, run_dir)
    saved = _saved(run_dir)
    _only_our_keys(saved)
    assert saved["trainer"]["algorithm"]["policy_loss_type"] == "rollout_is"
    assert saved["trainer"]["fully_async"] == {"enabled": True, "max_staleness_steps": 4, "partial_rollout_tokens": 0}
    assert "SkyRL's fully async updates the engines' weights mid-generation" in result.stdout  # said, not silent
    rows = [row for row in read_metrics(os.path.join(run_dir, "metrics.jsonl")) if row.get("step")]
    # the trainer's old logprobs measured against the engine's, the example's geometric mask applied to them
    assert all("rollout_logprob_abs_diff_max" in row and "geo_sequence_mask_masked_ratio" in row for row in rows)
    assert [row["policy_lag"] for row in rows] == [0, 1]
