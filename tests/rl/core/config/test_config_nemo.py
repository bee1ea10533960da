"""NeMo RL key spellings: backend switches, one-to-one keys, the both-enabled warning, files and errors."""

from __future__ import annotations

import logging
import textwrap

import pytest

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import ConfigError, load_config


def test_megatron_switch_selects_megatron():
    assert load_config(["policy.megatron_cfg.enabled=true"]).trainer.strategy == "megatron"


@pytest.mark.parametrize("spelling", ["dtensor_cfg", "dtensor_config"])
def test_dtensor_switch_selects_fsdp2(spelling):
    cfg = load_config(["trainer.strategy=deepspeed", f"policy.{spelling}.enabled=true"])
    assert cfg.trainer.strategy == "fsdp2"


def test_disabled_switches_leave_strategy_alone():
    cfg = load_config(["trainer.strategy=deepspeed", "policy.megatron_cfg.enabled=false"])
    assert cfg.trainer.strategy == "deepspeed"


def test_both_enabled_picks_megatron_and_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="rl.core.config"):
        cfg = load_config(["policy.dtensor_cfg.enabled=true", "policy.megatron_cfg.enabled=true"])
    assert cfg.trainer.strategy == "megatron"
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "policy.dtensor_cfg.enabled" in message and "policy.megatron_cfg.enabled" in message
    assert "megatron" in message


def test_single_switch_does_not_warn(caplog):
    with caplog.at_level(logging.WARNING):
        load_config(["policy.megatron_cfg.enabled=true"])
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


def test_megatron_parallel_keys_map_onto_megatron_config():
    cfg = load_config(
        [
            "policy.megatron_cfg.enabled=true",
            "policy.megatron_cfg.tensor_model_parallel_size=2",
            "policy.megatron_cfg.pipeline_model_parallel_size=2",
            "policy.megatron_cfg.expert_model_parallel_size=2",
            "policy.megatron_cfg.sequence_parallel=true",
            "trainer.placement.policy_num_gpus_per_node=8",
            "trainer.placement.ref_num_gpus_per_node=8",
        ]
    )
    mc = cfg.blocks["trainer.policy.megatron_config"]
    assert (mc.tensor_model_parallel_size, mc.pipeline_model_parallel_size, mc.expert_model_parallel_size) == (2, 2, 2)
    assert mc.sequence_parallel is True


def test_general_keys_map():
    cfg = load_config(
        [
            "policy.model_name=Qwen/Qwen3-0.6B",
            "grpo.num_generations_per_prompt=8",
            "policy.train_micro_batch_size=2",
            "policy.optimizer.kwargs.lr=5e-7",
            "loss_fn.reference_policy_kl_penalty=0.01",
            "grpo.max_num_steps=100",
        ]
    )
    assert cfg.trainer.policy.model.path == "Qwen/Qwen3-0.6B"
    assert cfg.generator.n_samples_per_prompt == 8
    assert cfg.trainer.micro_train_batch_size_per_gpu == 2
    assert cfg.trainer.policy.optimizer_config.lr == 5e-7
    assert cfg.trainer.algorithm.kl_loss_coef == 0.01
    assert cfg.trainer.max_steps == 100


def test_cluster_keys_map_onto_the_placement():
    cfg = load_config(["cluster.gpus_per_node=2", "cluster.num_nodes=1"])
    assert (cfg.trainer.placement.policy_num_nodes, cfg.trainer.placement.policy_num_gpus_per_node) == (1, 2)


def test_nemo_sections_in_a_file(tmp_path):
    path = tmp_path / "nemo.yaml"
    path.write_text(
        textwrap.dedent(
            """
            policy:
              model_name: my/model
              megatron_cfg:
                enabled: true
                tensor_model_parallel_size: 2
            grpo:
              num_generations_per_prompt: 2
            trainer:
              placement:
                policy_num_gpus_per_node: 2
                ref_num_gpus_per_node: 2
            """
        ),
        encoding="utf-8",
    )
    cfg = load_config([], config_file=str(path))
    assert cfg.trainer.strategy == "megatron"
    assert cfg.blocks["trainer.policy.megatron_config"].tensor_model_parallel_size == 2
    assert cfg.trainer.policy.model.path == "my/model"
    assert cfg.generator.n_samples_per_prompt == 2


def test_strategy_flag_wins_over_nemo_switch():
    cfg = load_config(["policy.megatron_cfg.enabled=true"], strategy="fsdp")
    assert cfg.trainer.strategy == "fsdp"


def test_nemo_megatron_knob_without_megatron_is_rejected():
    with pytest.raises(ConfigError) as info:
        load_config(["policy.megatron_cfg.tensor_model_parallel_size=2"])
    assert "trainer.policy.megatron_config.tensor_model_parallel_size" in str(info.value)


def test_unsupported_nemo_key_names_it_and_suggests():
    with pytest.raises(ConfigError) as info:
        load_config(["grpo.num_generation_per_prompt=4"])
    message = str(info.value)
    assert "grpo.num_generation_per_prompt" in message
    assert "grpo.num_generations_per_prompt" in message


def test_switch_must_be_boolean():
    with pytest.raises(ConfigError, match=r"policy\.megatron_cfg\.enabled: expected true or false"):
        load_config(["policy.megatron_cfg.enabled=maybe"])
