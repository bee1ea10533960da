"""Row readers for prompt files, one per file extension, chosen through `FILE_READERS`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.core.data.errors import DataError
from rl.core.registry import Registry


@dataclass(frozen=True)
class RawRow:
    """One row as read from a file; `where` locates it for error messages ("a.jsonl line 3", "b.parquet row 7")."""

    where: str
    values: dict[str, Any]


RowReader = Callable[[Path], list[RawRow]]
FILE_READERS: Registry[RowReader] = Registry("prompt file format")


def read_rows(path: Path) -> list[RawRow]:
    """Read every row of a prompt file with the reader registered for its extension."""
    extension = path.suffix.lower()
    if extension not in FILE_READERS:
        raise DataError(
            f"{path}: unsupported file extension '{extension or '(none)'}'; "
            f"prompt files must be one of: {', '.join(FILE_READERS.names())}"
        )
    if not path.exists():
        raise DataError(f"{path}: no such file; check the path (a leading ~ is expanded)")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file; pass the path of a parquet or jsonl file")
    return FILE_READERS.get(extension)(path)


@FILE_READERS.register(".jsonl")
def read_jsonl(path: Path) -> list[RawRow]:
    """One JSON object per line (lines end at "\n", an "\r" before it allowed, as JSON Lines says: a U+2028 or
    other Unicode line break inside a JSON string is part of the string); blank lines are skipped, any other
    unparsable line is an error naming it."""
    rows = []
    for number, line in enumerate(_read_text(path).split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: not valid JSON ({err.msg}); fix or remove the line") from None
        if not isinstance(value, dict):
            raise DataError(f"{where}: expected a JSON object per line, got {type(value).__name__}")
        rows.append(RawRow(where, value))
    return rows


@FILE_READERS.register(".parquet")
def read_parquet(path: Path) -> list[RawRow]:
    """Every row of a parquet file as plain Python values (lists of structs become lists of dicts)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as err:
        raise DataError(f"{path}: cannot read as parquet ({err}); regenerate the file or check it is parquet") from None
    return [RawRow(f"{path} row {number}", values) for number, values in enumerate(table.to_pylist())]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot read as UTF-8 text ({err})") from None
