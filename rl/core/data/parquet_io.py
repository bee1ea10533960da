"""Atomic parquet writes: a reader never sees a half-written file, and a failed write leaves the old file intact."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

from rl.core.data.errors import DataError


def write_parquet_atomic(rows: list[dict[str, Any]], path: Path, schema: Any = None) -> None:
    """Write `rows` to `path` via a temporary file in the same directory, then `os.replace` it into place."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows, schema=schema)
    temporary = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: never reuse someone else's file; mode 0o666 so the umask decides permissions as for any new file.
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        pq.write_table(table, temporary)
        os.replace(temporary, path)
    except OSError as err:
        raise DataError(f"{path}: cannot write parquet ({err}); check the output directory is writable") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
