"""Command-line overrides: `key=value` with the value read as YAML (`3`, `1e-6`, `true`, `null`, `"['a','b']"`)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

import yaml

from rl.core.config.errors import Problems
from rl.core.config.keys import Kind, Node, accepts_str
from rl.core.config.yaml_io import parse_text

NULLS = frozenset({"", "~", "null", "Null", "NULL"})
"""Override texts that mean null."""


@dataclass(frozen=True)
class Override:
    key: str
    raw: str
    """The text after `=`, unparsed: the value's type depends on the key it lands on."""


def split_override(text: str, problems: Problems) -> Override | None:
    """`trainer.seed=3` -> Override("trainer.seed", "3"); None after adding a problem if it is not key=value."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        problems.add(text or "<empty override>", "not a key=value override; write it like trainer.seed=1")
        return None
    return Override(key, raw)


def parse_value(key: str, raw: str, node: Node | None, problems: Problems) -> tuple[bool, Any]:
    """(ok, value) of an override's text for the key's node.

    A string key (str or str | None) takes the text as written, without surrounding spaces: quotes are optional,
    and only an empty text, `~` or `null` mean null, so `trainer.run_name=2024` is the string "2024". A list of
    strings given one number keeps its text too. Every other value is YAML (`true`, `3`, `1e-6`, `null`,
    `[0.9, 0.95]`, `{stage: 3}`).
    """
    if node is not None and node.kind is Kind.LEAF and _is_text(node.type):
        return True, _text_value(raw.strip())
    try:
        value = parse_text(raw)
    except yaml.YAMLError as exc:
        reason = str(exc).splitlines()[0]
        problems.add(
            key,
            f"cannot read {raw!r} as a YAML value ({reason}); quote strings and write lists like {key}=\"['a','b']\"",
        )
        return False, None
    if node is not None and node.kind is Kind.LEAF and accepts_str(node.type) and isinstance(value, bool | int | float):
        return True, raw.strip()
    return True, value


def _is_text(tp: Any) -> bool:
    return tp is str or (str in typing.get_args(tp) and typing.get_origin(tp) is not list)


def _text_value(text: str) -> str | None:
    if text in NULLS:
        return None
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        try:
            quoted = parse_text(text)
        except yaml.YAMLError:
            return text
        return quoted if isinstance(quoted, str) else text
    return text
