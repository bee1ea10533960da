"""Config files as NeMo RL users write them: `defaults:` inheritance and `${...}` interpolation.

`defaults: parent.yaml` (or a list of files) names files relative to the file that holds it; each is read the same
way (its own `defaults:` first), merged in order, and the file's own keys merged over them, as NeMo RL's
`load_config_with_inheritance` does: mappings merge key by key, anything else replaces, and a mapping marked
`_override_: true` replaces the inherited one whole. After the merge, `${...}` interpolations are resolved (so a
child's value reaches every key that interpolates it) by OmegaConf, with the resolvers NeMo RL registers (`mul`,
`add`, `div`, `max`): see `interpolation.py`.
Hydra's config-group defaults (SkyRL's old `defaults: [_self_, group@pkg: name]`) are not read.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

import yaml

from rl.core.config.dialects.interpolation import needs_resolution, resolve
from rl.core.config.errors import ConfigError
from rl.core.config.yaml_io import read_yaml

OVERRIDE_MARK = "_override_"


def read_config_file(path: str) -> Any:
    """The file's mapping with its `defaults:` merged in and its interpolations resolved (other YAML as read)."""
    data = _read_with_defaults(path, ())
    if isinstance(data, dict) and needs_resolution(data):
        data = resolve(data, path)
    return data


def _read(path: str, child: str | None = None) -> Any:
    """`child`: the file whose `defaults:` names this one (named when this one cannot be read)."""
    try:
        return read_yaml(path)
    except OSError as exc:
        named = f" (named in defaults: of {child})" if child else ""
        raise ConfigError([f"config file {path}{named}: cannot be read ({exc.strerror}); check the path"]) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError([f"config file {path}: is not UTF-8 text (byte {exc.start}); save it as UTF-8"]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([f"config file {path}: is not valid YAML ({exc}); fix the syntax"]) from exc


def _read_with_defaults(path: str, chain: tuple[str, ...], child: str | None = None) -> Any:
    real = os.path.realpath(path)
    if real in chain:
        cycle = " -> ".join([*chain, real])
        raise ConfigError([f"config file {path}: defaults: inherits itself ({cycle}); remove the loop"])
    data = _read(path, child)
    if not isinstance(data, dict) or "defaults" not in data:
        return data
    parents = _parent_files(data.pop("defaults"), path)
    merged: dict[str, Any] = {}
    for parent in parents:
        inherited = _read_with_defaults(parent, (*chain, real), path)
        if not isinstance(inherited, dict):
            raise ConfigError([f"config file {parent} (a default of {path}): must hold a mapping of sections"])
        merged = merge(merged, inherited)
    return merge(merged, data)


def _parent_files(defaults: Any, path: str) -> list[str]:
    names = [defaults] if isinstance(defaults, str) else defaults
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names) or "_self_" in names:
        raise ConfigError(
            [
                f"config file {path}: defaults: {defaults!r} is not a file or a list of files; Hydra "
                "config groups are not read here: list the parent files (relative to this file), or "
                "write their keys into the file"
            ]
        )
    base = os.path.dirname(os.path.abspath(path))
    return [name if os.path.isabs(name) else os.path.join(base, name) for name in names]


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`update` over `base`: mappings merge key by key unless marked `_override_: true`, anything else replaces."""
    merged = copy.deepcopy(dict(base))
    for name, value in update.items():
        if isinstance(value, Mapping) and value.get(OVERRIDE_MARK) is True:
            merged[name] = {key: copy.deepcopy(item) for key, item in value.items() if key != OVERRIDE_MARK}
        elif isinstance(value, Mapping) and isinstance(merged.get(name), Mapping):
            merged[name] = merge(merged[name], value)
        else:
            merged[name] = copy.deepcopy(value)
    return merged
