"""Reward functions named in config, the registered ones and the user's own, and how one call's result is read.

`data.reward_fn` is a registered name (`gsm8k`), `package.module:function` or `path/to/file.py:function`, or a
list of them (weighted by `data.reward_weights`, TRL's name). A function is called as
`fn(response, answer, **fields)`: the response text, the row's reference answer, and, by keyword, the row's other
columns it names in its signature (all of them when it takes `**kwargs`; `prompt`, `data_source` and `index` are
always available). It returns a number, or a dict with a `score` and further numbers that are logged as metrics.
"""

from __future__ import annotations

import inspect
import math
import os
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rl.core.rewards.registry import REWARD_FUNCTIONS
from rl.core.user_code import call_guarded, is_reference, load_object


class RewardValueError(ValueError):
    """A reward function returned something that is not a finite score."""


@dataclass(frozen=True)
class RewardFunctionSpec:
    """One configured reward: where it comes from, its weight in the sum, and the name its metrics carry."""

    reference: str
    weight: float

    @property
    def name(self) -> str:
        return self.reference.rpartition(":")[2] if is_reference(self.reference) else self.reference


def reward_specs(reward_fn: str | list[str], weights: list[float] | None) -> list[RewardFunctionSpec]:
    references = [reward_fn] if isinstance(reward_fn, str) else list(reward_fn)
    weights = [1.0] * len(references) if weights is None else [float(w) for w in weights]
    return [RewardFunctionSpec(reference, weight) for reference, weight in zip(references, weights, strict=True)]


def load_reward_function(reference: str, key: str = "data.reward_fn") -> Callable:
    """The function `reference` names (registered name or user code), its signature checked; errors name `key`."""
    if is_reference(reference):
        fn = load_object(reference, key)
    elif reference in REWARD_FUNCTIONS:
        fn = REWARD_FUNCTIONS.get(reference)
    else:
        raise ValueError(f"{key}: {REWARD_FUNCTIONS.unknown_message(reference)} Your own function: "
                         "'package.module:function' or 'path/to/file.py:function'")
    check_signature(fn, reference, key)
    return fn


def check_signature(fn: Any, reference: str, key: str) -> None:
    """`fn(response, answer, ...)`: two positional parameters first; any others must be keyword-passable."""
    if not callable(fn):
        raise ValueError(f"{key}: '{reference}' is a {type(fn).__name__}, not a function")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise ValueError(f"{key}: '{reference}' is an async function; reward functions are called synchronously "
                         "(in the reward processes, which run them side by side): define it with plain 'def'")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    required = [p.name for p in positional[2:] if p.default is p.empty and p.kind == p.POSITIONAL_ONLY]
    if (len(positional) < 2 and not takes_varargs) or required:
        shown = f"{getattr(fn, '__name__', reference)}{inspect.signature(fn)}"
        raise ValueError(f"{key}: '{reference}' has the signature {shown}; a reward function is called as "
                         "fn(response, answer, **fields): two positional parameters (the response text and the "
                         "reference answer), then optionally row columns by name or **kwargs")


def keyword_fields(fn: Callable, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The row fields `fn` asks for: those its signature names after (response, answer), or all with **kwargs."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return {}
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return dict(fields)
    named = [p for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    missing = [p.name for p in named if p.default is p.empty and p.name not in fields]
    if missing:
        raise RewardValueError(f"asks for the row field(s) {', '.join(missing)}, which the row does not have "
                               f"(its fields: {', '.join(sorted(fields)) or 'none'})")
    return {p.name: fields[p.name] for p in named if p.name in fields}


def read_result(value: Any) -> tuple[float, dict[str, float]]:
    """(score, extra metrics) of what a reward function returned; anything else raises `RewardValueError`."""
    extras: dict[str, float] = {}
    if isinstance(value, Mapping):
        if "score" not in value:
            raise RewardValueError(f"returned a dict without a 'score' key (keys: {', '.join(map(str, value))})")
        for name, extra in value.items():
            if name != "score":
                extras[str(name)] = _number(extra, f"its '{name}' entry")
        value = value["score"]
    return _number(value, "its score"), extras


def _number(value: Any, what: str) -> float:
    """A bool, int, float or numpy/torch scalar as a finite float (text is not a number here)."""
    try:
        number = float(value) if not isinstance(value, str | bytes) else None
    except (TypeError, ValueError):
        number = None
    if number is None:
        raise RewardValueError(f"{what} is {type(value).__name__} {value!r:.60}, not a number")
    if not math.isfinite(number):
        raise RewardValueError(f"{what} is {number}, not a finite number")
    return number


def call_reward(fn: Callable, response: str, answer: str, fields: Mapping[str, Any]) -> tuple[float, dict[str, float]]:
    """One call, its result read: `(score, extras)`; raises what `fn` raises, `RewardValueError`, or `UserExit`
    for a SystemExit or KeyboardInterrupt it raised (which ends the run whatever data.reward_on_error says)."""
    return read_result(call_guarded(fn, response, answer, **keyword_fields(fn, fields)))


def failure_text(error: BaseException) -> str:
    """How a failed call is reported: a bad return value by what was wrong with it, an exception by its type,
    message and the line of the user's code it came from."""
    if isinstance(error, RewardValueError):
        return str(error)
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"
