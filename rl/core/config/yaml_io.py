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
    one mapping (PyYAML would keep the last silently). Merge keys (`<<: *anchor`) work as in PyYAML's safe_load:
    a key written in the mapping overrides the one merged in, so only keys written twice are refused."""

    def flatten_mapping(self, node):
        # Checked before the merge: flattening puts the merged entries into node.value next to the written ones.
        if not getattr(node, "keys_checked", False):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<` is no key of the mapping: its entries are merged in below
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key '{key}' appears twice in one mapping; keep one", key_node.start_mark)
                seen.add(key)
            node.keys_checked = True
        super().flatten_mapping(node)


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
