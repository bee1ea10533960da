"""The key tree of the schema: which dotted keys exist, and what kind of value each holds."""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing
from dataclasses import dataclass
from typing import Any

from rl.core.config import strategies
from rl.core.config.errors import Problems
from rl.core.config.schema import Config


class Kind(enum.Enum):
    SECTION = "section"
    """A nested dataclass: its keys are fixed."""
    FREE = "free"
    """A `dict[str, Any]` passed through to a library: any key below it is accepted."""
    LEAF = "leaf"
    """A typed value."""


@dataclass(frozen=True)
class Node:
    kind: Kind
    type: Any


ROOT = Node(Kind.SECTION, Config)
ANY = Node(Kind.LEAF, Any)
"""What a key inside a free-form dict holds."""


@functools.cache
def fields_of(cls: type) -> dict[str, Any]:
    """Field name -> resolved type annotation, in declaration order (the loader's own `Config.blocks` excluded)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if not f.metadata.get("strategy_blocks")}


def node_of(tp: Any) -> Node:
    if dataclasses.is_dataclass(tp):
        return Node(Kind.SECTION, tp)
    if typing.get_origin(tp) is dict:
        return Node(Kind.FREE, tp)
    return Node(Kind.LEAF, tp)


def all_keys() -> tuple[str, ...]:
    """Every dotted key of the schema and of the registered strategies' blocks, sections included."""
    found: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        for name, tp in fields_of(cls).items():
            key = prefix + name
            found.append(key)
            if dataclasses.is_dataclass(tp):
                walk(tp, key + ".")

    walk(Config, "")
    for key, block in strategies.block_types().items():
        found.append(key)
        walk(block, key + ".")
    return tuple(found)


def _blocks_under(parent: str) -> list[str]:
    """Names of the strategies' blocks directly under section `parent`."""
    prefix = parent + "." if parent else ""
    return [key[len(prefix):] for key in strategies.block_types()
            if key.startswith(prefix) and "." not in key[len(prefix):]]


def unknown_key_message(key: str, parent: str, cls: type) -> str:
    """Unknown `key` under section `parent`: a suggestion of the same meaning (rl.core.config.dialects.suggest),
    and the valid keys there."""
    from rl.core.config.dialects.suggest import suggestion

    where = f"under {parent}" if parent else "at the top level"
    valid = ", ".join([*fields_of(cls), *_blocks_under(parent)])
    return f"unknown key{suggestion(key, all_keys())}; valid keys {where}: {valid}"


def lookup(key: str, problems: Problems) -> Node | None:
    """The node a dotted key names, or None after adding a problem that says what is wrong with the key."""
    node, failure = _walk(key)
    if failure is None:
        return node
    kind, parent, segment, section = failure
    if kind == "malformed":
        problems.add(key, "malformed key (empty part between dots); write it like trainer.algorithm.kl_loss_coef")
    elif kind == "leaf":
        problems.add(
            key, f"{parent} is a single value, not a section, so it has no key '{segment}'; set {parent} itself"
        )
    else:
        problems.add(key, unknown_key_message(key, parent, section))
    return None


def known(key: str) -> bool:
    """Whether `key` names a key of the schema (or one inside a free-form mapping), without building a message."""
    return _walk(key)[1] is None


def _walk(key: str) -> tuple[Node | None, tuple[str, str, str, Any] | None]:
    """(the node `key` names, None), or (None, (what is wrong, the parent key, the segment, the parent's type))."""
    segments = key.split(".")
    if not all(segments):
        return None, ("malformed", "", "", None)
    node, start = ROOT, 0
    found = strategies.block_at(key)
    if found is not None:  # a strategy's block: its own dataclass from there on
        node, start = Node(Kind.SECTION, found[1]), found[0].count(".") + 1
    for depth, segment in enumerate(segments[start:], start):
        parent = ".".join(segments[:depth])
        if node.kind is Kind.FREE:
            return ANY, None
        if node.kind is Kind.LEAF:
            return None, ("leaf", parent, segment, None)
        fields = fields_of(node.type)
        if segment not in fields:
            return None, ("unknown", parent, segment, node.type)
        node = node_of(fields[segment])
    return node, None


def accepts_str(tp: Any) -> bool:
    """Whether a leaf of this type takes a string (str, str | None, list[str]); free-form values do not."""
    if tp is str:
        return True
    if typing.get_origin(tp) is list:
        return accepts_str(typing.get_args(tp)[0])
    return str in typing.get_args(tp)
