"""Other projects' environment variables read by the launchers: SkyRL's worker timeout (or NCCL_TIMEOUT) is
trainer.collective_timeout_s when the config gives none, said in one line; the config's own value wins; a value
that is not a number of seconds is refused naming the variable."""

import pytest

import rl.backends.registry  # noqa: F401  (the strategies the config names)
from rl.core.config import ConfigError, load_config
from rl.launch.environment import apply_environment


def test_skyrl_timeout_variable_sets_the_collective_timeout():
    cfg = load_config([])
    lines = apply_environment(cfg, {"SKYRL_WORKER_NCCL_TIMEOUT_IN_S": "3600", "NCCL_TIMEOUT": "60"})
    assert cfg.trainer.collective_timeout_s == 3600.0
    assert lines == ["environment: SKYRL_WORKER_NCCL_TIMEOUT_IN_S=3600 read as trainer.collective_timeout_s=3600"]
    cfg = load_config([])
    apply_environment(cfg, {"NCCL_TIMEOUT": "90"})
    assert cfg.trainer.collective_timeout_s == 90.0


def test_the_config_wins_and_nothing_set_changes_nothing():
    cfg = load_config(["trainer.collective_timeout_s=120"])
    assert apply_environment(cfg, {"SKYRL_WORKER_NCCL_TIMEOUT_IN_S": "3600"}) == []
    assert cfg.trainer.collective_timeout_s == 120.0
    cfg = load_config([])
    assert apply_environment(cfg, {}) == [] and cfg.trainer.collective_timeout_s is None


@pytest.mark.parametrize("text", ["ten", "0", "-5"])
def test_a_bad_value_is_refused_naming_the_variable(text):
    with pytest.raises(ConfigError, match=rf"NCCL_TIMEOUT='{text}' in the environment .* number of seconds > 0"):
        apply_environment(load_config([]), {"NCCL_TIMEOUT": text})
