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


@pytest.fixture
def local_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"question": ["1 + 1?"], "answer": ["2"]}), path)
    return str(path)


def test_command_line_data_blocks_win_over_the_recipe_file(local_rows):
    """NeMo RL's way to train its recipe on local data, from the command line: the recipe's hub dataset, columns and
    prompt file give way to the overrides, which its data rule reads together with the file's keys."""
    from tests.rl.core.config.upstream_configs import NEMO_1B

    cfg = load_config(["data.train.dataset_name=ResponseDataset", f"data.train.data_path={local_rows}",
                       "data.train.input_key=question", "data.train.output_key=answer",
                       "data.default.prompt_file=null"], config_file=NEMO_1B)
    assert cfg.data.train_data == [local_rows]
    assert (cfg.data.prompt_key, cfg.data.answer_key, cfg.data.prompt_template_file) == ("question", "answer", None)
    # the recipe's dataset_name set to null, or dropped with Hydra's ~key, gives way to data_path the same way
    for dropped in ("data.train.dataset_name=null", "~data.train.dataset_name"):
        cfg = load_config([dropped, f"data.train.data_path={local_rows}", "data.default.prompt_file=null"],
                          config_file=NEMO_1B)
        assert cfg.data.train_data == [local_rows], dropped
    with pytest.raises(ConfigError, match="OpenMathInstruct-2"):  # the control: the recipe's own dataset is refused
        load_config(["data.default.prompt_file=null"], config_file=NEMO_1B)


def test_hydra_delete_and_add_prefixes(tmp_path):
    """`~key` drops what the file (or an earlier override) set for the key and everything under it, so a key of
    ours is back at its default; `+key=` / `++key=` set it either way; `~` of a key nothing sets is named."""
    config = tmp_path / "run.yaml"
    config.write_text("trainer: {seed: 3, policy: {optimizer_config: {lr: 0.5, weight_decay: 0.1}}}\n",
                      encoding="utf-8")
    defaults = load_config([])
    dropped = load_config(["~trainer.seed", "~trainer.policy.optimizer_config"], config_file=str(config))
    assert dropped.trainer.seed == defaults.trainer.seed != 3
    assert dropped.trainer.policy.optimizer_config == defaults.trainer.policy.optimizer_config
    assert load_config(["~trainer.seed", "++trainer.seed=5"], config_file=str(config)).trainer.seed == 5
    assert load_config(["+trainer.seed=6"], config_file=str(config)).trainer.seed == 6
    # Hydra's `~key=value` form names the value too; the key is dropped the same way
    assert load_config(["~trainer.seed=3"], config_file=str(config)).trainer.seed == defaults.trainer.seed
    with pytest.raises(ConfigError, match=r"~trainer\.sede: nothing sets trainer\.sede to delete"):
        load_config(["~trainer.sede"], config_file=str(config))


def test_a_config_file_that_is_not_a_mapping_is_named(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("- trainer.seed: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"config file {config}: must hold a mapping of sections"):
        load_config([], config_file=str(config))
