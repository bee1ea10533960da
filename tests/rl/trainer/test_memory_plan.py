"""The memory planner where it acts: `trainer.strategy=auto` through the config loader (the launcher's resolver),
the choice recorded in config.yaml and printed by a launcher run, and preflight refusing a layout predicted not to
fit, with the numbers and a layout that fits, unless trainer.placement.allow_predicted_oom."""

from __future__ import annotations

import os

import pytest
import yaml

import rl.backends.registry  # noqa: F401
from rl.core.config import ConfigError, load_config, save_config
from rl.trainer.memory_plan import memory_problems, resolve_auto
from rl.trainer.preflight import preflight
from tests.testing.model_configs import LLAMA2_70B, MIXTRAL_8X7B, QWEN25_7B, write_config_dir

BIG = ("trainer.placement.colocate_all=false", "trainer.placement.policy_num_gpus_per_node=8",
       "trainer.placement.gpu_memory_gb=80", "trainer.train_batch_size=64", "trainer.policy_mini_batch_size=64")


def _auto(*overrides):
    return load_config(["trainer.strategy=auto", *overrides], auto=resolve_auto)


def test_embedded_job_gets_fsdp2():
    cfg = _auto()
    assert cfg.trainer.strategy == "fsdp2" and "< 14B -> fsdp2" in cfg.trainer.auto_choice
    sized = _auto("trainer.placement.gpu_memory_gb=24")
    assert sized.trainer.strategy == "fsdp2" and "predicted peak" in sized.trainer.auto_choice


def test_mixtral_gets_megatron(tmp_path):
    path = write_config_dir(str(tmp_path / "mixtral"), MIXTRAL_8X7B)
    cfg = _auto(f"trainer.policy.model.path={path}", "trainer.placement.policy_num_nodes=2", *BIG)
    assert cfg.trainer.strategy == "megatron"
    assert "mixture of experts (8 experts) -> megatron" in cfg.trainer.auto_choice


def test_70b_on_64_gpus_gets_megatron_and_is_recorded(tmp_path):
    path = write_config_dir(str(tmp_path / "llama70b"), LLAMA2_70B)
    cfg = _auto(f"trainer.policy.model.path={path}", "trainer.placement.policy_num_nodes=8", *BIG)
    assert cfg.trainer.strategy == "megatron" and "> 30B -> megatron" in cfg.trainer.auto_choice
    block = cfg.blocks["trainer.policy.megatron_config"]
    assert block.tensor_model_parallel_size * block.pipeline_model_parallel_size > 1
    save_config(cfg, str(tmp_path / "config.yaml"))  # what the run writes into its directory
    with open(tmp_path / "config.yaml") as f:
        saved = yaml.safe_load(f)
    assert saved["trainer"]["strategy"] == "megatron"
    assert saved["trainer"]["auto_choice"] == cfg.trainer.auto_choice
    reloaded = load_config([], config_file=str(tmp_path / "config.yaml"))
    assert reloaded.trainer.strategy == "megatron" and reloaded.trainer.auto_choice is None


def test_auto_needs_a_resolver():
    with pytest.raises(ConfigError, match=r"trainer\.strategy: auto is resolved by the launchers"):
        load_config(["trainer.strategy=auto"])


def _seven_b(tmp_path, *overrides):
    path = write_config_dir(str(tmp_path / "qwen7b"), QWEN25_7B)
    return load_config([f"trainer.policy.model.path={path}", "trainer.placement.gpu_memory_gb=24", *overrides])


def test_preflight_refuses_7b_full_fine_tuning_on_24gb(tmp_path):
    cfg = _seven_b(tmp_path)
    with pytest.raises(ConfigError) as refused:
        preflight(cfg)
    [line] = [p for p in refused.value.problems if "predicted" in p]
    assert line.startswith("trainer.strategy: fsdp2 as configured is predicted to need")
    assert "24.0 GiB of one GPU (trainer.placement.gpu_memory_gb)" in line
    assert "params 28.4" in line  # 7,615,616,512 fp32 parameters on one GPU: 28.4 GiB
    fix = ("trainer.strategy=fsdp2 trainer.policy.fsdp_config.cpu_offload=true "
           "trainer.ref.fsdp_config.cpu_offload=true")
    assert "a layout predicted to fit" in line and fix in line
    assert "trainer.placement.allow_predicted_oom=true" in line
    fixed = _seven_b(tmp_path, *fix.split()[1:])
    assert memory_problems(fixed) == []
    preflight(fixed)  # nothing else in the way: the refusal was the memory's
    assert memory_problems(_seven_b(tmp_path, "trainer.placement.allow_predicted_oom=true")) == []


def test_nothing_fits_says_how_to_get_there(tmp_path):
    path = write_config_dir(str(tmp_path / "llama70b"), LLAMA2_70B)
    cfg = load_config([f"trainer.policy.model.path={path}", "trainer.placement.gpu_memory_gb=4",
                       "trainer.placement.colocate_all=false"])
    [line] = memory_problems(cfg)
    assert "no layout is predicted to fit" in line and "trainer.placement.policy_num_gpus_per_node" in line


def test_colocated_vllm_that_cannot_hold_the_model(tmp_path):
    """Mixtral's 87 GiB of bf16 weights in a colocated vLLM engine that may claim 0.8 of an 80 GiB GPU: refused on
    the engine's key, whatever the training layout."""
    path = write_config_dir(str(tmp_path / "mixtral"), MIXTRAL_8X7B)
    cfg = load_config([f"trainer.policy.model.path={path}", "trainer.strategy=megatron", "generator.backend=vllm",
                       "trainer.placement.gpu_memory_gb=80", "trainer.placement.policy_num_gpus_per_node=8",
                       "trainer.policy.megatron_config.expert_model_parallel_size=8"])
    [line] = memory_problems(cfg)
    assert line.startswith("generator.gpu_memory_utilization: a vLLM engine's claim (0.8 x 80.0 GiB)")
    assert "trainer.placement.colocate_all=false" in line


def test_launcher_prints_and_records_the_auto_choice(tmp_path):
    """One tiny launcher run with --strategy=auto: the choice is printed and config.yaml holds it."""
    from tests.testing.tiny_job import make_tiny_job, run_train

    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    done = run_train(run_dir, [*job.overrides(steps=1), "--strategy=auto"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainer.strategy=auto chose fsdp2 (rule: 529,024 parameters < 14B -> fsdp2)" in done.stdout
    with open(os.path.join(run_dir, "config.yaml")) as f:
        saved = yaml.safe_load(f)
    assert saved["trainer"]["strategy"] == "fsdp2" and "< 14B -> fsdp2" in saved["trainer"]["auto_choice"]
