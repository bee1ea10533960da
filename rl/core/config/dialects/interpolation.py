"""`${...}` interpolations and `???` marks in a config mapping, resolved by OmegaConf as NeMo RL resolves them.

NeMo RL registers four resolvers (`mul`, `add`, `div`, `max`: nemo_rl/utils/config.py); they are registered here
once, when this module is imported, unless the process already has a resolver of that name (NeMo RL does the same,
so both can share a process), without a cache, so each load resolves afresh. OmegaConf's own (`oc.env`,
`oc.select`, ...) come with it. When OmegaConf fails, each value that holds an interpolation is resolved on its own,
so every key at fault is named; OmegaConf's errors become ConfigErrors that name the file, the key, what is written
there and the fix. A `???` (OmegaConf's mark for a value the user must set) is refused wherever it is left.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import (
    GrammarParseError,
    InterpolationKeyError,
    InterpolationToMissingValueError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    UnsupportedInterpolationType,
)

from rl.core.config.errors import ConfigError, did_you_mean

Path = tuple[Any, ...]
MISSING = "???"
NEMO_RESOLVERS = {
    "mul": lambda a, b: a * b,
    "add": lambda a, b: a + b,
    "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}
for _name, _function in NEMO_RESOLVERS.items():
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _function)


def needs_resolution(data: Any) -> bool:
    """Whether `data` holds a string with `${` or a `???` anywhere."""
    return next(_marked(data, ()), None) is not None


def resolve(data: Mapping[str, Any], file: str) -> dict[str, Any]:
    """A copy of `data` with every `${...}` resolved; a ConfigError naming `file` and each key that cannot be."""
    marked = dict(_marked(data, ()))
    try:
        return OmegaConf.to_container(OmegaConf.create(dict(data)), resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        first = exc
    # Each marked value on its own, to name every key at fault (OmegaConf stops at the first).
    try:
        config = OmegaConf.create(dict(data))
    except OmegaConfBaseException as exc:  # a value or key OmegaConf cannot hold: refused when the file is read
        path = next((path for path in marked if key_name(path) == exc.full_key), None)
        if path is not None:
            raise ConfigError([f"config file {file}: {_explain(exc, path, marked[path], data)}"]) from None
        raise ConfigError(
            [
                f"config file {file}: {exc.full_key or 'a key at the top'} cannot be read by OmegaConf "
                f"({_reason(exc)}); quote it so that YAML reads a string"
            ]
        ) from None
    problems = []
    for path, text in marked.items():
        try:
            _value_at(config, path)
        except OmegaConfBaseException as exc:
            problems.append(f"config file {file}: {_explain(exc, path, text, data)}")
    raise ConfigError(problems or [f"config file {file}: {first.full_key}: {_reason(first)}"]) from None


def key_name(path: Path) -> str:
    """`a.b[0].c` for the path ('a', 'b', 0, 'c')."""
    name = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else str(part)
    return name


def _marked(data: Any, path: Path) -> Iterator[tuple[Path, str]]:
    """(path, text) of every string below `data` that holds `${` or is `???`, in file order."""
    if isinstance(data, Mapping):
        for key, value in data.items():
            yield from _marked(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _marked(value, (*path, index))
    elif isinstance(data, str) and ("${" in data or data == MISSING):
        yield path, data


def _value_at(config: Any, path: Path) -> Any:
    node = config
    for part in path:  # the parents are mappings and lists of the file itself: only the last step resolves
        node = node[part]
    return node


def _explain(exc: OmegaConfBaseException, path: Path, text: str, data: Mapping[str, Any]) -> str:
    key = key_name(path)
    if isinstance(exc, MissingMandatoryValue):
        return f"{key} is '???' (OmegaConf's mark for a value left for you to set); set {key}"
    reason = _reason(exc)
    if isinstance(exc, InterpolationToMissingValueError):
        fix = "set the value it names"
    elif isinstance(exc, InterpolationKeyError):
        missing = re.search(r"Interpolation key '([^']*)' not found", reason)
        last = re.split(r"[.\[\]]", missing.group(1).rstrip("]"))[-1] if missing else ""
        names = _key_names(data)
        reason += did_you_mean(last, names) if last and last not in names else ""
        fix = "fix the key path or add the key"
    elif isinstance(exc, UnsupportedInterpolationType):
        fix = f"use one of NeMo RL's resolvers ({', '.join(NEMO_RESOLVERS)}) or OmegaConf's, or write the value out"
    elif isinstance(exc, GrammarParseError):
        fix = "write it in OmegaConf's interpolation grammar (escape a literal one as \\${...}) or write the value out"
    elif "Recursive interpolation" in reason or "parent node" in reason:
        fix = "the interpolations refer to each other in a loop: write one of the values out"
    else:
        fix = "fix what it reads (keys, environment variables, a resolver's arguments) or write the value out"
    return f"an interpolation at {key} ({text!r}) cannot be resolved ({reason}); {fix}"


def _reason(exc: OmegaConfBaseException) -> str:
    """OmegaConf's message without the `full_key:` / `object_type=` lines it appends."""
    return str(getattr(exc, "msg", "") or exc).strip().splitlines()[0]


def _key_names(data: Any) -> set[str]:
    names: set[str] = set()
    if isinstance(data, Mapping):
        names.update(str(key) for key in data)
        for value in data.values():
            names |= _key_names(value)
    elif isinstance(data, list):
        for value in data:
            names |= _key_names(value)
    return names
