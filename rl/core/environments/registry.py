"""Environments by name: `ENVIRONMENTS` holds the built-in ones, and a config may instead point at a user class.

Tasks register their environments when imported (importing `rl.tasks.environments` registers all of them), as
reward functions are registered; `make_environment_factory` resolves a config value to something that builds one
fresh environment per episode.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from rl.core.environments.base import Environment
from rl.core.registry import Registry
from rl.core.user_code import is_reference, load_object

ENVIRONMENTS: Registry[type[Environment]] = Registry("environment")


def make_environment_factory(
    name_or_reference: str, key: str, options: Mapping[str, Any] | None = None
) -> Callable[[], Environment]:
    """A no-argument callable that builds one environment: the class registered as `name_or_reference`, or the
    class a user reference (`package.module:Class`, `path/to/file.py:Class`) names, called with `options` as keyword
    arguments. Anything else is refused with a ValueError that names the config `key`."""
    if is_reference(name_or_reference):
        environment = load_object(name_or_reference, key)
    elif name_or_reference in ENVIRONMENTS:
        environment = ENVIRONMENTS.get(name_or_reference)
    else:
        raise ValueError(f"{key}: {ENVIRONMENTS.unknown_message(name_or_reference)}")
    if not (inspect.isclass(environment) and issubclass(environment, Environment)):
        raise ValueError(f"{key}: '{name_or_reference}' is {type(environment).__name__} {environment!r:.80}, not a "
                         "subclass of rl.core.environments.Environment")
    if inspect.isabstract(environment):
        missing = ", ".join(sorted(environment.__abstractmethods__))
        raise ValueError(f"{key}: environment class '{name_or_reference}' does not implement {missing}")
    # A class is already a factory; a partial only when there are options to bind.
    return functools.partial(environment, **options) if options else environment
