"""Applying the dialect tables to one layer of a config.

Order within a layer: the dialects' rules run first (value spellings of keys we share with SkyRL, NeMo RL's backend
switches, blocks switched off, keys that only mean something together); then every key left that is not ours is
looked up in the tables (SkyRL's, then NeMo RL's) and aliased, accepted as inert, or refused. A key in no table
goes on as written, so the schema names it as unknown (with a suggestion of the same meaning, if there is one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rl.core.config.dialects.entries import Alias, ByRule, Elsewhere, Entry, Inert, Refused, Removed, find, under
from rl.core.config.dialects.layer import MISSING, Item, Layer, Report, parse
from rl.core.config.errors import Problems
from rl.core.config.keys import known


@dataclass(frozen=True)
class Dialect:
    name: str
    """As printed: `SkyRL`, `NeMo RL`."""
    table: Callable[[], Mapping[str, Entry]]
    """Their key (or pattern) -> entry."""
    switches: Callable[[], Mapping[str, str]]
    """Block -> its switch key: while the layer sets the switch false, the block's other keys are ignored, as that
    project ignores them."""
    rules: tuple[Callable[[Layer], None], ...]
    """Run before the key-by-key lookup; each may take items and emit ours in their place."""


def is_ours(key: str) -> bool:
    """Whether `key` names a key of our schema (or a key inside one of our free-form mappings)."""
    return known(key)


def translate(
    items: list[Item], tree: dict[str, Any], problems: Problems, report: Report, dialects: tuple[Dialect, ...]
) -> list[Item]:
    """The layer's items with every other project's key replaced by ours (or refused, or accepted as inert)."""
    for item in items:
        if item.key.startswith("+"):  # Hydra's `+key=` / `++key=` (NeMo RL's overrides): set the key either way
            item.key = item.key.lstrip("+")
    layer = Layer(items, tree, problems, report, is_ours)
    for dialect in dialects:
        _switch_off_blocks(layer, dialect)
    for dialect in dialects:
        for rule in dialect.rules:
            rule(layer)
    tables = [(dialect.name, dialect.table()) for dialect in dialects]
    for key in layer.names():
        if is_ours(key) or not layer.has(key):
            continue
        for name, table in tables:
            entry = find(table, key)
            if entry is not None:
                apply_entry(layer, key, entry, name)
                break
    return layer.result()


def _switch_off_blocks(layer: Layer, dialect: Dialect) -> None:
    for block, switch in dialect.switches().items():
        if layer.value(switch, True) is not False:
            continue
        for key in layer.names(block):
            if key != switch:
                layer.take(key)
                layer.inert(key, f"{dialect.name}: {block} is switched off ({switch}=false)")


def apply_entry(layer: Layer, key: str, entry: Entry, dialect: str) -> None:
    """Translate the layer's `key` by its table entry."""
    if isinstance(entry, Elsewhere):
        block = key.split(".")[0]
        for other in layer.names(block):
            layer.take(other)
        layer.refuse(block, f"is {dialect}'s {entry.algorithm} block; {entry.where}")
        return
    item = layer.raw_item(key)
    value = layer.take(key)
    if isinstance(entry, Alias):
        emit_alias(layer, key, entry, dialect, value, item)
    elif isinstance(entry, Inert):
        if entry.accepts(value):
            layer.inert(key, entry.why)
        else:
            layer.refuse(key, f"is {value!r}, which asks for {entry.feature}: not available here; {entry.fix}")
    elif isinstance(entry, Refused):
        layer.refuse(key, f"asks for {entry.feature}: not available here; {entry.fix}")
    elif isinstance(entry, Removed):
        layer.refuse(key, f"{dialect} removed this key ({entry.change}); drop it")
    elif isinstance(entry, ByRule):  # its rule found a value it does not translate
        layer.refuse(key, f"{value!r} cannot be read here: {dialect}'s key means {entry.meaning}")


def emit_alias(layer: Layer, key: str, entry: Alias, dialect: str, value: Any, item: Item | None) -> None:
    if entry.convert is not None:
        try:
            converted = entry.convert(value)
        except (TypeError, ValueError) as error:
            layer.refuse(key, f"{value!r} cannot be read as {entry.target} ({error})")
            return
        layer.emit(entry.target, converted)
    elif item is not None and item.raw:
        layer.emit(entry.target, item.value, raw=True)  # typed by our key, as an override of it would be
    else:
        layer.emit(entry.target, value)
    layer.alias(key, entry.target, dialect)
    if entry.differs:
        layer.differs(key, dialect, entry.differs)


LIFTED_ENGINE_ARGUMENTS = {"kv_cache_memory_bytes": "generator.kv_cache_memory_bytes"}
"""vLLM arguments the peers pass in their free-form engine mappings that are keys of ours."""


def move_mapping(layer: Layer, theirs: str, ours: str, dialect: str, lifted: dict[str, str] | None = None) -> None:
    """Another project's free-form mapping (`theirs`, whole or key by key) as the same entries of ours; an entry
    named in `lifted` goes to the key of ours it names instead (an argument we give a key of its own)."""
    layer.expand(theirs)
    for key in layer.names(theirs):
        value = layer.take(key)
        target = (lifted or {}).get(key[len(theirs) + 1:]) or ours + key[len(theirs):]
        layer.emit(target, {} if key == theirs and value is None else value)
        layer.alias(key, target, dialect)


def take_all(layer: Layer, prefix: str) -> dict[str, Any]:
    """Every key left under `prefix` with its parsed value, consumed."""
    return {key: layer.take(key) for key in layer.names(prefix)}


def given(value: Any) -> bool:
    return value is not MISSING


__all__ = [
    "LIFTED_ENGINE_ARGUMENTS",
    "MISSING",
    "Dialect",
    "Item",
    "Layer",
    "Report",
    "apply_entry",
    "given",
    "is_ours",
    "move_mapping",
    "parse",
    "take_all",
    "translate",
    "under",
]
