"""Config -> dict -> Config, and save_config -> load_config, give back an equal config."""

from __future__ import annotations

import os

import pytest
import yaml

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import Config, ConfigError, config_from_dict, config_to_dict, load_config, save_config

_CUSTOM = [
    "trainer.strategy=deepspeed",
    "deepspeed_config.train={zero_optimization: {stage: 2}}",
    "trainer.policy.optimizer_config.lr=1e-7",
    "trainer.logger=[console, tensorboard]",
    "trainer.run_name=2024",
    "trainer.max_steps=null",
    "data.val_data=[]",
]


@pytest.mark.parametrize("overrides", [[], _CUSTOM], ids=["defaults", "custom"])
def test_dict_round_trip(overrides):
    cfg = load_config(overrides)
    data = config_to_dict(cfg)
    assert isinstance(data, dict) and isinstance(data["trainer"]["policy"], dict)
    assert config_from_dict(data) == cfg


def test_to_dict_is_a_copy():
    cfg = load_config([])
    data = config_to_dict(cfg)
    data["trainer"]["policy"]["optimizer_config"]["betas"].append(0.5)
    data["deepspeed_config"]["train"]["x"] = 1
    assert cfg.trainer.policy.optimizer_config.betas == [0.9, 0.999]
    assert cfg.blocks["deepspeed_config"].train == {}


@pytest.mark.parametrize("overrides", [[], _CUSTOM], ids=["defaults", "custom"])
def test_save_then_load_gives_equal_config(tmp_path, overrides):
    cfg = load_config(overrides)
    path = tmp_path / "out" / "config.yaml"
    save_config(cfg, str(path))
    assert load_config([], config_file=str(path)) == cfg
    with open(path, encoding="utf-8") as handle:
        assert yaml.safe_load(handle) == config_to_dict(cfg)


def test_save_replaces_an_existing_file_and_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old: content\n", encoding="utf-8")
    save_config(load_config(["trainer.seed=5"]), str(path))
    assert os.listdir(tmp_path) == ["config.yaml"]
    assert load_config([], config_file=str(path)).trainer.seed == 5


def test_from_dict_reports_missing_and_unknown_keys():
    data = config_to_dict(load_config([]))
    del data["trainer"]["seed"]
    data["generator"]["temprature"] = 0.5
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    message = str(info.value)
    assert "trainer.seed: missing" in message
    assert "generator.temprature: unknown key (did you mean 'generator.temperature'?)" in message


def test_from_dict_validates_values_unless_told_not_to():
    data = config_to_dict(load_config([]))
    data["generator"]["top_p"] = 2.0
    with pytest.raises(ConfigError, match=r"generator\.top_p"):
        config_from_dict(data)
    cfg = config_from_dict(data, validate=False)
    assert isinstance(cfg, Config) and cfg.generator.top_p == 2.0
