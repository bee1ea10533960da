"""The packaged defaults file and typed access to a built config by dotted key."""

from __future__ import annotations

import copy
import functools
import os
from typing import Any

from rl.core.config.yaml_io import read_yaml

DEFAULTS_PATH = os.path.join(os.path.dirname(__file__), "defaults.yaml")


@functools.cache
def _defaults() -> dict[str, Any]:
    data = read_yaml(DEFAULTS_PATH)
    if not isinstance(data, dict):
        raise RuntimeError(f"{DEFAULTS_PATH} must hold a mapping of config sections")
    return data


def default_tree() -> dict[str, Any]:
    """A fresh deep copy of defaults.yaml as plain nested dicts."""
    return copy.deepcopy(_defaults())


def default_value(key: str) -> Any:
    """The default of a dotted key (a deep copy)."""
    node: Any = _defaults()
    for segment in key.split("."):
        node = node[segment]
    return copy.deepcopy(node)


def get(cfg: Any, key: str) -> Any:
    """The value at a dotted key of a built config (`get(cfg, "trainer.seed")`)."""
    node = cfg
    for segment in key.split("."):
        node = getattr(node, segment)
    return node
