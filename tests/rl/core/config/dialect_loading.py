"""Loading a config the way the dialect tests look at it: the loader's printed lines, and the problems of a refused
config by key."""

from __future__ import annotations

import logging

import pytest

from rl.core.config import ConfigError, load_config


def load_logged(caplog, overrides=(), config_file=None):
    with caplog.at_level(logging.INFO, logger="rl.core.config"):
        return load_config(list(overrides), config_file=config_file)


def refusals(overrides=(), config_file=None) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config(list(overrides), config_file=config_file)
    return {line.split(":", 1)[0]: line for line in info.value.problems}


def config_lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.getMessage().startswith("config: ")]
