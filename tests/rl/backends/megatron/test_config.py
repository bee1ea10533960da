"""The megatron block is checked at load time against the model's own config.json and megatron-core's own
TransformerConfig, so a layout or a keyword megatron would refuse fails in the config, not after Ray and the model."""

import json
import re

import pytest

import rl.backends.registry  # noqa: F401  (registers the training strategies)
from rl.core.config import ConfigError, load_config

BLOCK = "trainer.policy.megatron_config."
WORLD_4 = ["trainer.strategy=megatron", "trainer.placement.policy_num_gpus_per_node=4"]


@pytest.fixture
def model_dir(tmp_path):
    """A local model directory whose config.json has 14 attention heads, 2 key/value heads and 6 layers."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "qwen2", "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 6}))
    return str(tmp_path)


def _problems(overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    return str(info.value)


def test_layout_that_does_not_divide_the_model_is_refused_naming_the_model(model_dir):
    path = f"trainer.policy.model.path={model_dir}"
    message = _problems([*WORLD_4, path, BLOCK + "tensor_model_parallel_size=4"])
    assert f"{BLOCK}tensor_model_parallel_size: 4 must divide the model's 14 attention heads" in message
    assert f"{BLOCK}tensor_model_parallel_size: 4 must divide the model's 2 key/value heads" in message
    assert f"{model_dir}/config.json" in message
    message = _problems([*WORLD_4, path, BLOCK + "pipeline_model_parallel_size=4"])
    assert f"{BLOCK}pipeline_model_parallel_size: 4 must divide the model's 6 layers" in message
    message = _problems([*WORLD_4, path, BLOCK + "expert_model_parallel_size=2"])
    assert f"{BLOCK}expert_model_parallel_size: 2 must divide the model's experts (None)" in message
    cfg = load_config([*WORLD_4, path, BLOCK + "tensor_model_parallel_size=2",
                       BLOCK + "pipeline_model_parallel_size=2"])
    assert cfg.blocks["trainer.policy.megatron_config"].tensor_model_parallel_size == 2


def test_interleaved_schedule_needs_a_pipeline_and_whole_chunks_of_layers(model_dir):
    path = f"trainer.policy.model.path={model_dir}"
    message = _problems([*WORLD_4, path, BLOCK + "virtual_pipeline_model_parallel_size=2"])
    assert (f"{BLOCK}virtual_pipeline_model_parallel_size: is 2, but the interleaved schedule needs "
            "pipeline_model_parallel_size > 1") in message
    message = _problems([*WORLD_4, path, BLOCK + "pipeline_model_parallel_size=2",
                         BLOCK + "virtual_pipeline_model_parallel_size=2"])
    assert f"{BLOCK}virtual_pipeline_model_parallel_size: PP 2 * VP 2 = 4 must divide the model's 6 layers" in message
    message = _problems([*WORLD_4, BLOCK + "virtual_pipeline_model_parallel_size=0"])
    assert f"{BLOCK}virtual_pipeline_model_parallel_size" in message
    cfg = load_config([*WORLD_4, path, BLOCK + "pipeline_model_parallel_size=2",
                       BLOCK + "virtual_pipeline_model_parallel_size=3"])
    assert cfg.blocks["trainer.policy.megatron_config"].virtual_pipeline_size() == 3
    # NeMo RL's key for it
    cfg = load_config(["policy.megatron_cfg.enabled=true", "policy.megatron_cfg.pipeline_model_parallel_size=2",
                       "policy.megatron_cfg.virtual_pipeline_model_parallel_size=2",
                       "trainer.placement.policy_num_gpus_per_node=2"])
    assert cfg.blocks["trainer.policy.megatron_config"].virtual_pipeline_model_parallel_size == 2


def test_transformer_config_kwargs_may_not_repeat_the_blocks_own_keys():
    message = _problems(["trainer.strategy=megatron",
                         BLOCK + "transformer_config_kwargs={virtual_pipeline_model_parallel_size: 2}"])
    assert (f"transformer_config_kwargs.virtual_pipeline_model_parallel_size: is a key of "
            f"{BLOCK[:-1]} itself; set {BLOCK}virtual_pipeline_model_parallel_size instead") in message


def test_transformer_config_kwargs_must_be_transformer_config_fields():
    message = _problems(["trainer.strategy=megatron", BLOCK + "transformer_config_kwargs={attention_dropuot: 0.0}"])
    assert re.search(r"transformer_config_kwargs\.attention_dropuot: is not a field of megatron-core's "
                     r"TransformerConfig \(did you mean 'attention_dropout'\?\)", message)


def test_recompute_modules_are_checked_by_megatron_core():
    message = _problems(["trainer.strategy=megatron",
                         BLOCK + "transformer_config_kwargs={recompute_modules: [feedforward]}"])
    assert "transformer_config_kwargs.recompute_modules: megatron-core refuses it" in message
    assert "'mlp'" in message  # megatron-core's own list of allowed modules
    load_config(["trainer.strategy=megatron", BLOCK + "recompute_granularity=selective",
                 BLOCK + "transformer_config_kwargs={recompute_modules: [mlp, core_attn]}"])
