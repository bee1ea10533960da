"""The deepspeed block is checked at load time by DeepSpeed's own ZeRO config model, merged over the backend's
defaults as the backend merges it: a bad stage or a misspelt key fails in the config, not after Ray and the model."""

import logging

import pytest

import rl.backends.registry  # noqa: F401  (registers the training strategies)
from rl.core.config import ConfigError, load_config

DS = ["trainer.strategy=deepspeed"]


def _problems(overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_config([*DS, *overrides])
    return str(info.value)


def test_zero_stage_deepspeed_does_not_have_is_refused():
    message = _problems(["deepspeed_config.train.zero_optimization.stage=7"])
    assert "deepspeed_config.train.zero_optimization.stage: DeepSpeed refuses it" in message
    assert "got 7" in message


def test_unknown_zero_knob_is_refused_by_deepspeeds_model():
    message = _problems(["deepspeed_config.eval.zero_optimization.stgae=3"])
    assert "deepspeed_config.eval.zero_optimization.stgae: DeepSpeed refuses it" in message


def test_misspelt_top_level_key_is_named_with_the_right_spelling():
    message = _problems(["deepspeed_config.train={zero_optimisation: {stage: 3}}"])
    assert "deepspeed_config.train.zero_optimisation: is not a DeepSpeed config key (did you mean " \
           "'zero_optimization'?)" in message


def test_zero3_knobs_under_a_lower_stage_warn_naming_the_stage_key(caplog):
    with caplog.at_level(logging.WARNING, logger="rl.core.config"):
        load_config([*DS, "deepspeed_config.train.zero_optimization.offload_param={device: cpu}"])
    assert "deepspeed_config.train.zero_optimization.offload_param does nothing at " \
           "deepspeed_config.train.zero_optimization.stage=2" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rl.core.config"):
        load_config([*DS, "deepspeed_config.train.zero_optimization={stage: 3, offload_param: {device: cpu}}"])
    assert "does nothing" not in caplog.text
