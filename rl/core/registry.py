"""Name -> implementation registries, so config strings pick code without if/elif chains."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of implementations. `register` is a decorator; `get` names the valid choices on a miss."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = entry
            return entry

        return add

    def remove(self, name: str) -> None:
        del self._entries[name]

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, self._entries, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        return f"unknown {self.kind} '{name}'; choose one of: {', '.join(sorted(self._entries))}.{hint}"

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))
