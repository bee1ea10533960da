"""The packaged defaults file and typed access to a built config by dotted key."""

from __future__ import annotations

import copy
import functools
import os
from typing import Any

from rl.core.config.merge import flatten
from rl.core.config.yaml_io import read_yaml

DEFAULTS_PATH = os.path.join(os.path.dirname(__file__), "defaults.yaml")
EMBEDDED_JOB_PATH = os.path.join(os.path.dirname(__file__), "embedded_job.yaml")


@functools.cache
def _defaults() -> dict[str, Any]:
    data = read_yaml(DEFAULTS_PATH)
    if not isinstance(data, dict):
        raise RuntimeError(f"{DEFAULTS_PATH} must hold a mapping of config sections")
    return data


def default_tree() -> dict[str, Any]:
    """A fresh deep copy of defaults.yaml as plain nested dicts."""
    return copy.deepcopy(_defaults())


def embedded_job_tree() -> dict[str, Any]:
    """The defaults with embedded_job.yaml's values over them: the settings of the embedded default job."""
    tree = default_tree()
    for key, value in flatten(read_yaml(EMBEDDED_JOB_PATH)):
        *parents, last = key.split(".")
        node = tree
        for segment in parents:
            node = node[segment]
        if last not in node:
            raise RuntimeError(f"{EMBEDDED_JOB_PATH}: {key} is not a key of defaults.yaml")
        node[last] = value
    return tree


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
