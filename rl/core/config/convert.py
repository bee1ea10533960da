"""Plain nested mappings <-> typed dataclasses, checking every key and every value's type on the way in."""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from rl.core.config.errors import Problems
from rl.core.config.keys import fields_of, unknown_key_message

_SCALARS: dict[type, tuple[str, str]] = {
    bool: ("true or false", "true"),
    int: ("an integer", "3"),
    float: ("a number", "0.5 (or 1e-6)"),
    str: ("a string", "'2024' (quoted in YAML when it looks like a number)"),
}
"""Type -> (what the error says is expected, an example value)."""


def build(cls: type, data: Any, prefix: str, problems: Problems) -> Any:
    """An instance of dataclass `cls` from a mapping holding every field; None after adding problems if it cannot."""
    where = prefix[:-1] if prefix else "the config"
    if not isinstance(data, Mapping):
        problems.add(where, f"expected a mapping of keys ({', '.join(fields_of(cls))}), got {describe_value(data)}")
        return None
    before = len(problems.lines)
    fields = fields_of(cls)
    for name in data:
        if name not in fields:
            problems.add(f"{prefix}{name}", unknown_key_message(f"{prefix}{name}", prefix[:-1], cls))
    values = {}
    for name, tp in fields.items():
        key = prefix + name
        if name not in data:
            problems.add(key, "missing; add it (rl/core/config/defaults.yaml lists every key with its default)")
            continue
        values[name] = coerce(data[name], tp, key, problems)
    if len(problems.lines) > before:
        return None
    return cls(**values)


def coerce(value: Any, tp: Any, key: str, problems: Problems) -> Any:
    """`value` checked against `tp`; ints become floats for float fields, nothing else is converted."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key + ".", problems)
    if tp is Any:
        return copy.deepcopy(value)
    if origin is types.UnionType or origin is typing.Union:
        if value is None and type(None) in typing.get_args(tp):
            return None
        (inner,) = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        return coerce(value, inner, key, problems)
    if origin is list:
        return _coerce_list(value, typing.get_args(tp)[0], key, problems)
    if origin is dict:
        if isinstance(value, Mapping):
            return copy.deepcopy(dict(value))
        problems.add(key, f"expected a mapping (e.g. {{}}), got {describe_value(value)}; give {key} as a mapping")
        return None
    return _coerce_scalar(value, tp, key, problems)


def _coerce_list(value: Any, element: Any, key: str, problems: Problems) -> list[Any]:
    if isinstance(value, Mapping):
        problems.add(
            key,
            f"expected a list, got {describe_value(value)}; write it like {key}=\"['a','b']\"",
        )
        return []
    if not isinstance(value, list | tuple):
        return [coerce(value, element, key, problems)]
    return [coerce(item, element, f"{key}[{index}]", problems) for index, item in enumerate(value)]


def _coerce_scalar(value: Any, tp: type, key: str, problems: Problems) -> Any:
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    what, example = _SCALARS[tp]
    problems.add(key, f"expected {what}, got {describe_value(value)}; set it to {what}, e.g. {key}={example}")
    return None


def describe_value(value: Any) -> str:
    """`'abc' (a string)`: the value and its YAML kind, for error messages."""
    kinds = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        type(None): "null",
    }
    kind = next((name for cls, name in kinds.items() if type(value) is cls), type(value).__name__)
    return "null" if value is None else f"{value!r} ({kind})"


def to_dict(cfg: Any) -> dict[str, Any]:
    """The plain nested dict of a dataclass tree (a deep copy)."""
    return dataclasses.asdict(cfg)
