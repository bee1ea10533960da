"""What one key of another project's config does here: the entry types of the dialect tables.

A dialect table maps a key as SkyRL or NeMo RL spells it (dotted, `*` matching one segment or, at the end, the rest
of the key) to one of:
- `Alias`: a key of ours with the same meaning (its value converted where only the spelling of values differs);
  with `differs` set, the meanings differ in a small documented way, printed when the alias is applied.
- `Inert`: no key of ours, and for the values `accepts` takes nothing to do: the feature is off, or the knob only
  changes speed or memory in the other project, or it asks for what this project always does. `why` says which;
  the key is listed at start with it. Any other value asks for a feature this project does not have and is refused,
  naming `feature` and `fix`.
- `Refused`: a feature this project does not have, whatever the value.
- `ByRule`: a key a rule of the dialect translates (its meaning depends on other keys or on its value).
- `Elsewhere`: a whole block configuring an algorithm this launcher does not train (NeMo RL's `sft:`, `dpo:`):
  one line names the algorithm and where it is, instead of a refusal per key.
- `Removed`: a key the other project itself has removed: refused naming that change, as that project refuses it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Entry = Any
"""Alias | Inert | Refused | Removed | Elsewhere | ByRule."""


@dataclass(frozen=True)
class Alias:
    target: str
    """The key of ours with that meaning."""
    convert: Callable[[Any], Any] | None = None
    """The value as our key spells it (e.g. SkyRL's -1 "off" interval is our 0); None keeps it as written."""
    differs: str = ""
    """Empty: the same meaning. Otherwise how the meaning differs here, printed when the alias is applied."""


@dataclass(frozen=True)
class Inert:
    why: str
    """Why an accepted value changes nothing here."""
    accepts: Callable[[Any], bool] = lambda value: True
    feature: str = ""
    """What a value `accepts` refuses asks for."""
    fix: str = ""
    """What to do instead (completes the refusal)."""


@dataclass(frozen=True)
class Refused:
    feature: str
    fix: str


@dataclass(frozen=True)
class Removed:
    change: str
    """When and why the other project dropped the key."""


@dataclass(frozen=True)
class Elsewhere:
    algorithm: str
    where: str
    """Where that algorithm is trained (or that it is not yet)."""


@dataclass(frozen=True)
class ByRule:
    """A key whose meaning depends on other keys or values; a rule of the dialect translates it. `meaning` says
    what it sets here (for suggestions and the README)."""

    meaning: str


def off(*values: Any) -> Callable[[Any], bool]:
    """A predicate true for the given values (compared as numbers when both are numbers: 1 == 1.0, not True)."""

    def accepts(value: Any) -> bool:
        return any(_equal(value, allowed) for allowed in values)

    return accepts


def _equal(value: Any, allowed: Any) -> bool:
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed or (type(value) is type(allowed) and value == allowed)
    if isinstance(value, int | float) and isinstance(allowed, int | float):
        return float(value) == float(allowed)
    if isinstance(value, str) and isinstance(allowed, int | float) and not isinstance(allowed, bool):
        try:  # YAML 1.1 readers give "1e-8" as text
            return float(value) == float(allowed)
        except ValueError:
            return False
    return value == allowed


EMPTY = off(None, {}, [], "", 0, False)
"""A value that asks for nothing (null, empty, zero, false)."""
NONE = off(None)
FALSE = off(False, None)


def speed_only(what: str) -> Inert:
    """A knob that changes only how fast or in how much memory the same numbers are computed."""
    return Inert(f"{what}: changes speed or memory only, not what is trained")


def ignored(why: str) -> Inert:
    return Inert(why)


def only(values: tuple[Any, ...], why: str, feature: str, fix: str) -> Inert:
    """Accepted at `values` (what this project does anyway), refused otherwise."""
    return Inert(why, off(*values), feature, fix)


def feature_off(feature: str, fix: str, values: tuple[Any, ...] = (False, None)) -> Inert:
    """A feature this project does not have, accepted while it is off (the given values)."""
    return Inert(f"off: {feature}", off(*values), feature, fix)


def find(table: Mapping[str, Entry], key: str) -> Entry | None:
    """The entry for `key`: its own, else the most specific pattern that matches it."""
    if key in table:
        return table[key]
    matches = [pattern for pattern in table if "*" in pattern and matches_pattern(pattern, key)]
    if not matches:
        return None
    return table[max(matches, key=lambda pattern: (pattern.count("."), -pattern.count("*"), len(pattern)))]


def matches_pattern(pattern: str, key: str) -> bool:
    """`a.*.c` matches one segment in place of `*`; a trailing `.*` matches any rest (`a.*` matches `a.b.c`)."""
    if pattern.endswith(".*") and key.startswith(pattern[:-1]) and "*" not in pattern[:-2]:
        return True
    parts, segments = pattern.split("."), key.split(".")
    return len(parts) == len(segments) and all(fnmatch.fnmatchcase(s, p) for p, s in zip(parts, segments, strict=True))


def under(key: str, block: str) -> bool:
    return key == block or key.startswith(block + ".")
