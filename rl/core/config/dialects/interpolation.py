"""`${...}` interpolations in a config mapping, resolved as OmegaConf resolves the ones NeMo RL's files hold.

The grammar read here (a subset of OmegaConf's):

- `${a.b.c}`: the value at an absolute key path; `${a.0}` and `${a[0]}` index a list.
- `${.x}`, `${..x}`, `${...x}`: relative paths; one dot is the mapping that holds the interpolation, each further
  dot one level up.
- A value that is exactly one interpolation takes the referenced value with its type (an int stays an int, a
  mapping is copied whole); an interpolation inside a longer string is written into it with `str()`.
- `${name:arg, ...}`: a resolver call, with the resolvers the caller passes (NeMo RL's `mul`, `add`, `div`, `max`)
  and OmegaConf's `oc.env:VAR[,default]`. An argument that is exactly one interpolation keeps its type (so
  `${mul:${a}, ${b}}` multiplies numbers), a plain one is read as OmegaConf reads it (`2` an int, `2.5` a float,
  `true` a bool, `null` None, anything else a string), a quoted one (`'a,b'`) is a string, and `\\,` escapes a comma.
- `\\${` is a literal `${`.
- Interpolations resolve through each other (a key interpolating a key that interpolates another), in place, so
  a relative path is always relative to where it is written; a loop is refused with the keys that form it.

Not read: interpolations inside key paths (`${a.${b}}`), lists and mappings as resolver arguments, and OmegaConf's
other `oc.*` resolvers; each is refused by name.
"""

from __future__ import annotations

import copy
import inspect
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rl.core.config.errors import ConfigError, did_you_mean

Path = tuple[Any, ...]
MISSING = "???"  # OmegaConf's mark for a value the user must set


def resolve(data: Mapping[str, Any], file: str, resolvers: Mapping[str, Callable[..., Any]]) -> dict[str, Any]:
    """A copy of `data` with every `${...}` resolved; a ConfigError naming `file` and the key when one cannot be."""
    return _Resolution(copy.deepcopy(dict(data)), file, resolvers).run()


# --- parsing --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Key:
    dots: int
    parts: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class _Call:
    name: str
    args: tuple[_Arg, ...]
    text: str


@dataclass(frozen=True)
class _Arg:
    parts: tuple[_Part, ...]
    quoted: bool


_Part = str | _Key | _Call


class _Invalid(Exception):
    """A value that is not an interpolation this module reads."""


_NAME = re.compile(r"[^\s:{}$'\",\\]*")  # a key path or a resolver name, up to `}` or `:`
_RESOLVER_NAME = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*")
_ARG_ESCAPES = set("\\ \t,[]{}:=()'\"$")


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def value(self) -> list[_Part]:
        """The whole value: literal text, `\\${` escapes and interpolations."""
        parts: list[_Part] = []
        literal: list[str] = []
        text = self.text
        while self.pos < len(text):
            if text[self.pos] == "\\":
                end = self.pos
                while end < len(text) and text[end] == "\\":
                    end += 1
                if text.startswith("${", end):
                    count = end - self.pos
                    literal.append("\\" * (count // 2))
                    self.pos = end
                    if count % 2:
                        literal.append("${")
                        self.pos += 2
                    continue
                literal.append(text[self.pos : end])
                self.pos = end
            elif text.startswith("${", self.pos):
                _flush(literal, parts)
                parts.append(self._interpolation())
            else:
                literal.append(text[self.pos])
                self.pos += 1
        _flush(literal, parts)
        return parts

    def _interpolation(self) -> _Key | _Call:
        start = self.pos
        self.pos += 2
        self._skip_space()
        match = _NAME.match(self.text, self.pos)
        assert match is not None  # the pattern matches the empty string
        name = match.group()
        self.pos = match.end()
        self._skip_space()
        char = self._peek()
        if char == "}":
            self.pos += 1
            return self._key(name, self.text[start : self.pos])
        if char == ":":
            if not _RESOLVER_NAME.fullmatch(name):
                raise _Invalid(f"'{name}' is not a resolver name")
            self.pos += 1
            args = self._args()
            return _Call(name, tuple(args), self.text[start : self.pos])
        if char is None:
            raise _Invalid(f"'{self.text[start:]}' is not closed with '}}'")
        if self.text.startswith("${", self.pos):
            raise _Invalid("an interpolation inside a key path is not read here")
        raise _Invalid(f"unexpected '{char}' in '{self.text[start:]}'")

    def _key(self, name: str, text: str) -> _Key:
        dots = len(name) - len(name.lstrip("."))
        rest = name[dots:]
        if not rest:
            if not dots:
                raise _Invalid("'${}' names no key")
            return _Key(dots, (), text)
        flat = re.sub(r"\[([^\[\]]*)\]", r".\1", rest)
        parts = tuple(flat.split("."))
        if any(not part for part in parts) or "[" in flat or "]" in flat:
            raise _Invalid(f"'{text}' is not a key path")
        return _Key(dots, parts, text)

    def _args(self) -> list[_Arg]:
        self._skip_space()
        if self._peek() == "}":
            self.pos += 1
            return []
        args = []
        while True:
            args.append(self._arg())
            char = self._peek()
            self.pos += 1
            if char == "}":
                return args

    def _arg(self) -> _Arg:
        self._skip_space()
        char = self._peek()
        if char in ("'", '"'):
            parts = self._quoted(char)
            self._skip_space()
            if self._peek() not in (",", "}"):
                raise _Invalid(f"unexpected text after the quoted argument in '{self.text}'")
            return _Arg(tuple(parts), quoted=True)
        parts: list[_Part] = []
        literal: list[str] = []
        text = self.text
        while True:
            char = self._peek()
            if char is None:
                raise _Invalid(f"'{text}' is not closed with '}}'")
            if char in ",}":
                break
            if text.startswith("${", self.pos):
                _flush(literal, parts)
                parts.append(self._interpolation())
            elif char == "\\" and self.pos + 1 < len(text) and text[self.pos + 1] in _ARG_ESCAPES:
                if text.startswith("${", self.pos + 1):
                    literal.append("${")
                    self.pos += 3
                else:
                    literal.append(text[self.pos + 1])
                    self.pos += 2
            elif char in "[]{":
                raise _Invalid(f"lists and mappings as resolver arguments are not read here ('{text}')")
            else:
                literal.append(char)
                self.pos += 1
        _flush(literal, parts)
        if parts and isinstance(parts[-1], str):
            tail = parts[-1].rstrip()
            parts[-1:] = [tail] if tail else []
        return _Arg(tuple(parts), quoted=False)

    def _quoted(self, quote: str) -> list[_Part]:
        self.pos += 1
        parts: list[_Part] = []
        literal: list[str] = []
        text = self.text
        while True:
            char = self._peek()
            if char is None:
                raise _Invalid(f"the quote in '{text}' is not closed")
            if char == quote:
                self.pos += 1
                break
            if text.startswith("${", self.pos):
                _flush(literal, parts)
                parts.append(self._interpolation())
            elif char == "\\" and self.pos + 1 < len(text) and text[self.pos + 1] in (quote, "\\"):
                literal.append(text[self.pos + 1])
                self.pos += 2
            else:
                literal.append(char)
                self.pos += 1
        _flush(literal, parts)
        return parts

    def _peek(self) -> str | None:
        return self.text[self.pos] if self.pos < len(self.text) else None

    def _skip_space(self) -> None:
        while self._peek() in (" ", "\t"):
            self.pos += 1


def _flush(literal: list[str], parts: list[_Part]) -> None:
    if literal:
        parts.append("".join(literal))
        literal.clear()


_INT = r"(?:0|[1-9](?:_?[0-9])*)"
_DIGITS = r"[0-9](?:_?[0-9])*"
_POINT_FLOAT = rf"(?:{_INT}?\.{_DIGITS}|{_INT}\.)"
_FLOAT = re.compile(rf"[+-]?(?:{_POINT_FLOAT}|(?:{_INT}|{_POINT_FLOAT})[eE][+-]?{_DIGITS}|[Ii][Nn][Ff]|[Nn][Aa][Nn])")
_INTEGER = re.compile(rf"[+-]?{_INT}")


def _primitive(text: str) -> Any:
    """A plain resolver argument as OmegaConf reads it."""
    lowered = text.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INTEGER.fullmatch(text):
        return int(text.replace("_", ""))
    if _FLOAT.fullmatch(text):
        return float(text.replace("_", ""))
    return text


# --- resolution -----------------------------------------------------------------------------------------------------
class _Failure(Exception):
    def __init__(self, path: Path, reason: str, fix: str):
        super().__init__(reason)
        self.path, self.reason, self.fix = path, reason, fix


class _Loop(Exception):
    def __init__(self, paths: list[Path]):
        super().__init__("loop")
        self.paths = paths


def key_name(path: Path) -> str:
    """`a.b[0].c` for the path ('a', 'b', 0, 'c')."""
    name = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else str(part)
    return name or "the top of the file"


class _Resolution:
    def __init__(self, root: dict[str, Any], file: str, resolvers: Mapping[str, Callable[..., Any]]):
        self.root = root
        self.file = file
        self.resolvers = dict(resolvers)
        self.done: set[Path] = set()
        self.active: list[Path] = []

    def run(self) -> dict[str, Any]:
        try:
            self._resolve_under(())
        except _Loop as loop:
            chain = " -> ".join(key_name(path) for path in loop.paths)
            raise ConfigError(
                [
                    f"config file {self.file}: the interpolations at {chain} refer to each other in a loop; "
                    "write one of the values out"
                ]
            ) from None
        except _Failure as failure:
            raise ConfigError(
                [
                    f"config file {self.file}: an interpolation at {key_name(failure.path)} cannot be resolved "
                    f"({failure.reason}); {failure.fix}"
                ]
            ) from None
        return self.root

    # the tree
    def _get(self, path: Path) -> Any:
        node: Any = self.root
        for part in path:
            node = node[part]
        return node

    def _set(self, path: Path, value: Any) -> None:
        self._get(path[:-1])[path[-1]] = value

    def _is_done(self, path: Path) -> bool:
        return any(path[:length] in self.done for length in range(len(path) + 1))

    def _enter(self, path: Path) -> None:
        if path in self.active:
            raise _Loop([*self.active[self.active.index(path) :], path])
        self.active.append(path)

    def _resolve_at(self, path: Path) -> None:
        """Resolves the string at `path` in place, if it holds an interpolation not yet resolved."""
        if self._is_done(path):
            return
        value = self._get(path)
        if not (isinstance(value, str) and "${" in value):
            return
        self._enter(path)
        try:
            try:
                parts = _Parser(value).value()
            except _Invalid as exc:
                raise _Failure(path, f"{value!r}: {exc}", _FIX_WRITE) from None
            result = self._text(parts, path)
        finally:
            self.active.pop()
        self._set(path, result)
        self.done.add(path)

    def _resolve_under(self, path: Path) -> None:
        """Resolves every interpolation in the mapping or list at `path`."""
        if self._is_done(path):
            return
        self._enter(path)
        try:
            node = self._get(path)
            for key in list(node) if isinstance(node, dict) else range(len(node)):
                child = (*path, key)
                if isinstance(self._get(child), (dict, list)):
                    self._resolve_under(child)
                else:
                    self._resolve_at(child)
        finally:
            self.active.pop()

    # values
    def _text(self, parts: list[_Part], here: Path) -> Any:
        if len(parts) == 1 and not isinstance(parts[0], str):
            return self._value(parts[0], here)
        return "".join(part if isinstance(part, str) else self._written(part, here) for part in parts)

    def _written(self, part: _Key | _Call, here: Path) -> str:
        value = self._value(part, here)
        if isinstance(value, (dict, list)):
            kind = "mapping" if isinstance(value, dict) else "list"
            raise _Failure(
                here,
                f"{part.text} is a {kind} and cannot be written inside a string",
                "interpolate the whole value or one of its keys",
            )
        return str(value)

    def _value(self, part: _Key | _Call, here: Path) -> Any:
        if isinstance(part, _Key):
            return self._lookup(part, here)
        return self._call(part, here)

    def _lookup(self, key: _Key, here: Path) -> Any:
        if key.dots > len(here):
            raise _Failure(
                here,
                f"{key.text} goes {key.dots} levels up from {key_name(here)}, above the top of the file",
                "use fewer dots or an absolute path (a.b.c)",
            )
        base: Path = here[: len(here) - key.dots] if key.dots else ()
        path = base
        for part in key.parts:
            node = self._node(path)
            if isinstance(node, dict):
                if part in node:
                    path = (*path, part)
                elif part.lstrip("-").isdigit() and int(part) in node:
                    path = (*path, int(part))
                else:
                    where = f"{key_name(path)} has" if path else "the file has"
                    hint = did_you_mean(part, [str(name) for name in node])
                    raise _Failure(
                        here,
                        f"{key.text} names {key_name((*base, *key.parts))}, which this config file and the files "
                        f"it inherits do not hold: {where} no key '{part}'{hint}",
                        "fix the key path or add the key",
                    )
            elif isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise _Failure(
                        here,
                        f"{key.text}: {key_name(path)} is a list of {len(node)}, which has no item '{part}'",
                        "fix the index",
                    )
                path = (*path, int(part))
            else:
                raise _Failure(
                    here,
                    f"{key.text}: {key_name(path)} holds {node!r}, not a mapping with a key '{part}'",
                    "fix the key path",
                )
        value = self._node(path)
        if isinstance(value, (dict, list)):
            self._resolve_under(path)
            return copy.deepcopy(self._get(path))
        if value == MISSING:
            raise _Failure(
                here,
                f"{key.text} names {key_name(path)}, which is '???' (a value left for you to set)",
                f"set {key_name(path)}",
            )
        return value

    def _node(self, path: Path) -> Any:
        self._resolve_at(path)
        return self._get(path)

    def _call(self, call: _Call, here: Path) -> Any:
        args = [self._arg(arg, here) for arg in call.args]
        if call.name == "oc.env":
            return self._env(call, args, here)
        function = self.resolvers.get(call.name)
        if function is None:
            known = ", ".join(sorted([*self.resolvers, "oc.env"]))
            raise _Failure(
                here,
                f"{call.text} calls '{call.name}', which is not a resolver read here (these are: {known})",
                _FIX_WRITE,
            )
        try:
            inspect.signature(function).bind(*args)
        except TypeError:
            raise _Failure(
                here,
                f"{call.text} gives '{call.name}' {len(args)} argument{'s' if len(args) != 1 else ''}, and it "
                f"takes {_arity(function)}",
                "fix the arguments",
            ) from None
        except ValueError:  # a builtin without a signature: let the call say
            pass
        try:
            return function(*args)
        except Exception as exc:  # the resolver's own failure, e.g. a string multiplied by a string
            raise _Failure(
                here,
                f"{call.text} fails on {tuple(args)!r}: {type(exc).__name__}: {exc}",
                "fix the values it reads",
            ) from None

    def _env(self, call: _Call, args: list[Any], here: Path) -> Any:
        if len(args) not in (1, 2):
            raise _Failure(here, f"{call.text}: oc.env takes a variable name and an optional default", _FIX_WRITE)
        value = os.environ.get(str(args[0]))
        if value is not None:
            return value
        if len(args) == 2:
            return None if args[1] is None else str(args[1])
        raise _Failure(
            here,
            f"{call.text} reads the environment variable {args[0]}, which is not set",
            f"set {args[0]}, give a default (${{oc.env:{args[0]},default}}) or write the value out",
        )

    def _arg(self, arg: _Arg, here: Path) -> Any:
        parts = list(arg.parts)
        if arg.quoted:
            return "".join(part if isinstance(part, str) else self._written(part, here) for part in parts)
        if not parts:
            return ""
        if len(parts) == 1:
            part = parts[0]
            return _primitive(part) if isinstance(part, str) else self._value(part, here)
        return "".join(part if isinstance(part, str) else self._written(part, here) for part in parts)


_FIX_WRITE = "fix it or write the value out"


def _arity(function: Callable[..., Any]) -> str:
    params = inspect.signature(function).parameters.values()
    if any(param.kind is param.VAR_POSITIONAL for param in params):
        return "any number"
    positional = [param for param in params if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD)]
    required = sum(param.default is param.empty for param in positional)
    return str(required) if required == len(positional) else f"{required} to {len(positional)}"
