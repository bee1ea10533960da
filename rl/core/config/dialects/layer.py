"""One layer of a config (a file, or the override list) on its way from other projects' keys to ours.

A `Layer` holds the layer's (key, value) items in order. The dialect rules read and take items from it, emit items
of ours in their place, and record what they did in the `Report`; what is left is translated key by key. The items
of ours come out in the order of the items they replace, so a later item of the layer still wins over an earlier
one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from rl.core.config.errors import Problems
from rl.core.config.yaml_io import parse_text

MISSING = object()
"""What `Layer.value` returns for a key the layer does not hold."""


@dataclass
class Item:
    key: str
    value: Any
    raw: bool
    """`value` is the text of a `key=value` override (typed later by the key it lands on), not parsed YAML."""


@dataclass
class Report:
    """What the dialects did, printed once when the config is built."""

    aliases: list[tuple[str, str, str]] = field(default_factory=list)
    """(their key, our key, dialect) for every alias applied."""
    differs: list[str] = field(default_factory=list)
    """One line per accepted key whose meaning differs a little here."""
    inert: list[tuple[str, str]] = field(default_factory=list)
    """(key, why it changes nothing here)."""
    lines: list[str] = field(default_factory=list)
    """Other lines to print (algorithm blocks found, the fsdp note)."""
    later: list[tuple[str, Callable[[Any], str | None]]] = field(default_factory=list)
    """(key, check) run on the built config: a check returns the problem with the key's value there, or None."""

    def messages(self) -> list[str]:
        found = []
        if self.aliases:
            names = sorted({dialect for _, _, dialect in self.aliases})
            listed = ", ".join(f"{theirs} -> {ours}" for theirs, ours, _ in self.aliases)
            found.append(f"config: {len(self.aliases)} {' and '.join(names)} keys read as ours: {listed}")
        found.extend(f"config: {line}" for line in self.differs)
        if self.inert:
            by_why: dict[str, list[str]] = {}
            for key, why in self.inert:
                by_why.setdefault(why, []).append(key)
            listed = "; ".join(f"{', '.join(keys)} ({why})" for why, keys in by_why.items())
            found.append(f"config: {len(self.inert)} keys accepted with no effect here: {listed}")
        found.extend(f"config: {line}" for line in self.lines)
        return found


def parse(value: Any, raw: bool) -> Any:
    """An item's value as data: override text read as YAML (text that is no valid YAML stays text)."""
    if not raw:
        return value
    try:
        return parse_text(value)
    except yaml.YAMLError:
        return value


class Layer:
    """The items of one layer, with what the rules took and emitted."""

    def __init__(
        self,
        items: list[Item],
        tree: dict[str, Any],
        problems: Problems,
        report: Report,
        is_ours: Callable[[str], bool],
    ):
        self.items = items
        self.tree = tree
        self.problems = problems
        self.report = report
        self.is_ours = is_ours
        self.taken: set[int] = set()
        self.emitted: list[tuple[float, Item]] = []
        self._anchor = len(items)

    # --- reading ------------------------------------------------------------------------------------------------
    def positions(self, key: str) -> list[int]:
        return [index for index, item in enumerate(self.items) if item.key == key and index not in self.taken]

    def value(self, key: str, default: Any = MISSING) -> Any:
        """The parsed value the layer gives `key` (its last item), or `default`."""
        found = self.positions(key)
        if not found:
            return default
        item = self.items[found[-1]]
        return parse(item.value, item.raw)

    def has(self, key: str) -> bool:
        return bool(self.positions(key))

    def names(self, prefix: str = "") -> list[str]:
        """The keys left in the layer, in order, under `prefix` (all with an empty prefix)."""
        seen: list[str] = []
        for index, item in enumerate(self.items):
            if index in self.taken or item.key in seen:
                continue
            if not prefix or item.key == prefix or item.key.startswith(prefix + "."):
                seen.append(item.key)
        return seen

    def current(self, key: str) -> Any:
        """Our key's value as this layer leaves it so far: emitted, or given as ours in the layer, else the tree's
        value from the layers below (MISSING when the tree has no such key)."""
        for _, item in reversed(self.emitted):
            if item.key == key:
                return parse(item.value, item.raw)
        found = self.positions(key)
        if found and self.is_ours(key):
            item = self.items[found[-1]]
            return parse(item.value, item.raw)
        node: Any = self.tree
        for segment in key.split("."):
            if not isinstance(node, dict) or segment not in node:
                return MISSING
            node = node[segment]
        return copy.deepcopy(node)

    def expand(self, key: str) -> None:
        """Replace the layer's mapping value of `key` by one item per entry (`key.name`), in its place."""
        items, taken = [], set()
        for index, item in enumerate(self.items):
            value = parse(item.value, item.raw)
            if item.key == key and index not in self.taken and isinstance(value, dict):
                items.extend(Item(f"{key}.{name}", entry, False) for name, entry in value.items())
                continue
            if index in self.taken:
                taken.add(len(items))
            items.append(item)
        self.items, self.taken = items, taken

    # --- taking and emitting -------------------------------------------------------------------------------------
    def raw_item(self, key: str) -> Item | None:
        """The layer's last item of `key`, as given."""
        found = self.positions(key)
        return self.items[found[-1]] if found else None

    def take(self, key: str) -> Any:
        """The layer's value of `key` (MISSING if none); every item of `key` is consumed, and later emits without
        `at` go where its first item was."""
        value = self.value(key)
        found = self.positions(key)
        self.taken.update(found)
        if found:
            self._anchor = found[0]
        return value

    def emit(self, key: str, value: Any, at: str | None = None, raw: bool = False) -> None:
        """An item of ours, placed where the item `at` was (the key last taken when None)."""
        position = self._position(at)
        self.emitted.append((position + len(self.emitted) * 1e-6, Item(key, value, raw)))

    def _position(self, at: str | None) -> float:
        if at is not None:
            found = [index for index, item in enumerate(self.items) if item.key == at]
            if found:
                return float(found[0])
        return float(self._anchor)

    def refuse(self, key: str, message: str) -> None:
        self.problems.add(key, message)

    def inert(self, key: str, why: str) -> None:
        self.report.inert.append((key, why))

    def differs(self, key: str, dialect: str, note: str) -> None:
        self.report.differs.append(f"{key} ({dialect}): {note}")

    def alias(self, theirs: str, ours: str, dialect: str) -> None:
        self.report.aliases.append((theirs, ours, dialect))

    def later(self, key: str, check: Callable[[Any], str | None]) -> None:
        self.report.later.append((key, check))

    # --- the result ----------------------------------------------------------------------------------------------
    def result(self) -> list[Item]:
        """The items of ours in order: the layer's untaken items and the emitted ones."""
        placed = [(float(index), item) for index, item in enumerate(self.items) if index not in self.taken]
        placed.extend(self.emitted)
        return [item for _, item in sorted(placed, key=lambda pair: pair[0])]
