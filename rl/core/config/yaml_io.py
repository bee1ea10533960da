"""YAML reading and atomic writing.

The loader reads `1e-6` as a float (YAML 1.2), where PyYAML's YAML 1.1 rules would give the string "1e-6".
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """SafeLoader that also resolves exponent floats without a dot (`1e-6`, `3E2`) and refuses a key given twice in
    one mapping (PyYAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' appears twice in one mapping; keep one", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_text(text: str) -> Any:
    """A YAML document (or a single `key=value` value) as Python data."""
    return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader: no arbitrary objects


def read_yaml(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        return parse_text(handle.read())


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` so a reader sees the old file or the whole new one, never a partial write."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".yaml", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
