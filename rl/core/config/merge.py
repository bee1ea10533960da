"""Layering values onto the plain config tree, checking each key against the schema as it lands."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from rl.core.config.errors import Problems
from rl.core.config.keys import Kind, lookup


def set_key(tree: dict[str, Any], key: str, value: Any, problems: Problems) -> None:
    """Put `value` at dotted `key`. A mapping given for a section sets the keys it names and keeps the others; a
    mapping given for a free-form dict (e.g. deepspeed_config.train) is merged into it."""
    node = lookup(key, problems)
    if node is None:
        return
    if node.kind is Kind.SECTION:
        if not isinstance(value, Mapping):
            problems.add(key, f"is a section, not a single value; set its keys instead, e.g. {key}.<name>=<value>")
            return
        for child, child_value in value.items():
            set_key(tree, f"{key}.{child}", child_value, problems)
        return
    segments = key.split(".")
    parent = _parent_mapping(tree, segments, problems)
    if parent is None:
        return
    last = segments[-1]
    if isinstance(value, Mapping) and isinstance(parent.get(last), dict):
        merge_free(parent[last], value)
    else:
        parent[last] = copy.deepcopy(value)


def _parent_mapping(tree: dict[str, Any], segments: list[str], problems: Problems) -> dict[str, Any] | None:
    """The dict that holds the last segment, creating empty dicts inside free-form dicts as needed."""
    here = tree
    for depth, segment in enumerate(segments[:-1]):
        child = here.setdefault(segment, {})
        if not isinstance(child, dict):
            path = ".".join(segments[: depth + 1])
            problems.add(
                ".".join(segments),
                f"{path} holds {child!r}, not a mapping; give {path} as a mapping "
                f"(e.g. {path}={{{segments[depth + 1]}: ...}})",
            )
            return None
        here = child
    return here


def merge_free(target: dict[str, Any], update: Mapping[str, Any]) -> None:
    """Deep-merge `update` into `target` (both free-form): nested mappings merge, anything else replaces."""
    for name, value in update.items():
        if isinstance(value, Mapping) and isinstance(target.get(name), dict):
            merge_free(target[name], value)
        else:
            target[name] = copy.deepcopy(value)


def flatten(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """[(dotted key, leaf value)] of a nested mapping, in order."""
    items: list[tuple[str, Any]] = []
    for name, value in data.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            items.extend(flatten(value, key + "."))
        else:
            items.append((key, value))
    return items
