"""Build a `PromptDataset` from parquet and jsonl files."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from rl.core.data.errors import DataError
from rl.core.data.readers import RawRow, read_rows
from rl.core.data.records import PromptDataset, PromptRecord, parse_prompt


def load_prompt_dataset(
    paths: Sequence[str | Path], prompt_key: str = "prompt", answer_key: str = "answer"
) -> PromptDataset:
    """Read prompts from every file in `paths` (parquet or jsonl, `~` expanded), in order.

    Each row needs `prompt_key` (text or a list of chat messages) and `answer_key` (a string or number). Optional
    columns: `data_source` (defaults to the file's name without extension) and `index` (defaults to the row's
    0-based position in its file). Raises `DataError` for a missing, unreadable or empty file, an unsupported
    extension, or a missing/invalid key, naming the file and row at fault.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    if not paths:
        raise DataError("no prompt files given; pass at least one parquet or jsonl path")
    records: list[PromptRecord] = []
    resolved = tuple(Path(path).expanduser() for path in paths)
    for path in resolved:
        rows = read_rows(path)
        if not rows:
            raise DataError(f"{path}: the file holds no rows; remove it from the list or regenerate it")
        records.extend(_to_record(row, position, path, prompt_key, answer_key) for position, row in enumerate(rows))
    return PromptDataset(records, files=tuple(str(path) for path in resolved))


def _to_record(row: RawRow, position: int, path: Path, prompt_key: str, answer_key: str) -> PromptRecord:
    prompt = parse_prompt(_required(row, prompt_key, "prompt_key"), row.where)
    return PromptRecord(
        prompt=prompt,
        answer=_answer_text(_required(row, answer_key, "answer_key"), row.where, answer_key),
        data_source=_data_source(row, path),
        index=_index(row, position),
        fields={k: v for k, v in row.values.items() if k not in (prompt_key, answer_key, "data_source", "index")},
        where=row.where,
    )


def _required(row: RawRow, key: str, option: str) -> object:
    if key not in row.values:
        found = ", ".join(sorted(row.values)) or "(none)"
        raise DataError(
            f"{row.where}: no column '{key}' (columns found: {found}); "
            f"add it to the file or pass {option}= naming the column that holds it"
        )
    value = row.values[key]
    if value is None:
        raise DataError(f"{row.where}: column '{key}' is null; every row needs a value")
    return value


def _answer_text(value: object, where: str, key: str) -> str:
    """The reference answer as text: a non-empty string, or a finite number (a reward cannot grade NaN or '')."""
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: column '{key}' is an empty string; every row needs a reference answer")
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise DataError(f"{where}: column '{key}' is {value}; every row needs a finite reference answer")
        return str(value)
    raise DataError(f"{where}: column '{key}' must be a string or number, got {type(value).__name__} {value!r:.80}")


def _data_source(row: RawRow, path: Path) -> str:
    value = row.values.get("data_source")
    if value is None:
        return path.stem
    if not isinstance(value, str):
        raise DataError(f"{row.where}: column 'data_source' must be a string, got {type(value).__name__}")
    return value


def _index(row: RawRow, position: int) -> int:
    value = row.values.get("index")
    if value is None:
        return position
    if not isinstance(value, int) or isinstance(value, bool):
        raise DataError(f"{row.where}: column 'index' must be an integer, got {type(value).__name__} {value!r:.80}")
    return value
