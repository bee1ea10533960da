"""Settings other projects' users give as environment variables, read as our keys by the launchers when the config
leaves those keys unset (and said so, so that config.yaml and the log hold what the run used)."""

from __future__ import annotations

import os

from rl.core.config import ConfigError

TIMEOUT_VARIABLES = ("SKYRL_WORKER_NCCL_TIMEOUT_IN_S", "NCCL_TIMEOUT")
"""Seconds for the training workers' collectives: SkyRL's variable, then the plain name."""


def apply_environment(cfg, environ=os.environ) -> list[str]:
    """Sets trainer.collective_timeout_s from the first variable of TIMEOUT_VARIABLES that is set, when the config
    gives none; returns the lines to print. A value that is not a positive number is a ConfigError naming it."""
    if cfg.trainer.collective_timeout_s is not None:
        return []
    for name in TIMEOUT_VARIABLES:
        text = environ.get(name)
        if text is None:
            continue
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ConfigError([f"{name}={text!r} in the environment (read as trainer.collective_timeout_s): give a "
                               "number of seconds > 0, or unset it"])
        cfg.trainer.collective_timeout_s = seconds
        return [f"environment: {name}={text} read as trainer.collective_timeout_s={seconds:g}"]
    return []
