"""The packaged defaults file and typed access to a built config by dotted key."""

from __future__ import annotations

import copy
import functools
import os
from typing import Any

from rl.core.config import strategies
from rl.core.config.merge import flatten
from rl.core.config.yaml_io import read_yaml

DEFAULTS_PATH = os.path.join(os.path.dirname(__file__), "defaults.yaml")
EMBEDDED_JOB_PATH = os.path.join(os.path.dirname(__file__), "embedded_job.yaml")
# a built-in job's model path -> the file of its own settings
JOB_FILES = {"embedded": EMBEDDED_JOB_PATH,
             "embedded-vl": os.path.join(os.path.dirname(__file__), "embedded_vl_job.yaml")}


@functools.cache
def _defaults() -> dict[str, Any]:
    data = read_yaml(DEFAULTS_PATH)
    if not isinstance(data, dict):
        raise RuntimeError(f"{DEFAULTS_PATH} must hold a mapping of config sections")
    return data


def default_tree() -> dict[str, Any]:
    """A fresh deep copy of defaults.yaml as plain nested dicts, with every registered strategy's block (its
    dataclass defaults) at its key."""
    tree = copy.deepcopy(_defaults())
    for key, block in strategies.block_types().items():
        *parents, last = key.split(".")
        node = tree
        for segment in parents:
            node = node.setdefault(segment, {})
        node[last] = strategies.block_defaults(block)
    return tree


def embedded_job_tree(job: str = "embedded") -> dict[str, Any]:
    """The defaults with a built-in job's file (JOB_FILES) over them: the settings of the embedded default job, or
    of the embedded visual job."""
    tree, path = default_tree(), JOB_FILES[job]
    for key, value in flatten(read_yaml(path)):
        *parents, last = key.split(".")
        node = tree
        for segment in parents:
            node = node[segment]
        if last not in node:
            raise RuntimeError(f"{path}: {key} is not a key of defaults.yaml")
        node[last] = value
    return tree


def default_value(key: str) -> Any:
    """The default of a dotted key (a deep copy), strategies' blocks included."""
    node: Any = default_tree()
    for segment in key.split("."):
        node = node[segment]
    return copy.deepcopy(node)


def get(cfg: Any, key: str) -> Any:
    """The value at a dotted key of a built config (`get(cfg, "trainer.seed")`), strategies' blocks included."""
    node, rest = cfg, key
    found = strategies.block_at(key)
    if found is not None:
        node, rest = cfg.blocks[found[0]], key[len(found[0]) + 1:]
    for segment in filter(None, rest.split(".")):
        node = getattr(node, segment)
    return node
