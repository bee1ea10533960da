"""ConfigError and the collector that gathers every problem of a config before raising them together."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A config that cannot run. `problems` holds one line per problem, each naming the key and the fix."""

    def __init__(self, problems: Iterable[str]):
        self.problems = list(problems)
        count = len(self.problems)
        header = f"invalid config ({count} problem{'s' if count != 1 else ''}):"
        super().__init__("\n".join([header, *(f"  - {line}" for line in self.problems)]))


class Problems:
    """Collects problems as `key: message` lines, and warnings; `raise_if_any` raises the problems all at once."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def add(self, key: str, message: str) -> None:
        self.lines.append(f"{key}: {message}")

    def __bool__(self) -> bool:
        return bool(self.lines)

    def raise_if_any(self) -> None:
        if self.lines:
            raise ConfigError(self.lines)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest choice, or an empty string when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""
