"""Build a `PromptDataset` from parquet and jsonl files."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from rl.core.data.errors import DataError
from rl.core.data.images import IMAGE_COLUMNS, IMAGE_PLACEHOLDER, placeholder_count, row_images
from rl.core.data.layouts import prompt_and_answer
from rl.core.data.readers import RawRow, read_rows
from rl.core.data.records import PromptDataset, PromptRecord, parse_prompt
from rl.core.data.templates import PromptTemplate

EnvClassCheck = Callable[[str], str | None]
"""Given a row's `env_class`, the problem with it in this run (and how to fix it), or None when it is fine."""


def load_prompt_dataset(
    paths: Sequence[str | Path],
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    env_class_check: EnvClassCheck | None = None,
    template: PromptTemplate | None = None,
) -> PromptDataset:
    """Read prompts from every file in `paths` (parquet or jsonl, `~` expanded), in order.

    Each row needs `prompt_key` (text or a list of chat messages) and `answer_key` (a string or number); a row
    without an `answer_key` column takes its answer from `reward_spec.ground_truth` (SkyRL's layout), and one
    with neither column but a `messages` conversation ending in the assistant's answer is read as NeMo RL's math
    data (`rl.core.data.layouts`). Optional
    columns: `data_source` (defaults to the file's name without extension), `index` (defaults to the row's 0-based
    position in its file) and `env_class` (the environment that plays the row's episodes, a string or null; each
    is passed to `env_class_check`). With a `template` each prompt becomes the chat it builds from the row's problem
    (`rl.core.data.templates`), so every consumer of the records sees the same prompt. Raises `DataError` for a
    missing, unreadable or empty file, an unsupported extension, or a missing/invalid key, naming the file and row
    at fault.
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
        records.extend(_to_record(row, position, path, prompt_key, answer_key, env_class_check, template)
                       for position, row in enumerate(rows))
    return PromptDataset(records, files=tuple(str(path) for path in resolved))


def _to_record(row: RawRow, position: int, path: Path, prompt_key: str, answer_key: str,
               env_class_check: EnvClassCheck | None, template: PromptTemplate | None) -> PromptRecord:
    prompt, answer, answer_from = prompt_and_answer(row, prompt_key, answer_key)
    parsed = parse_prompt(prompt, row.where)
    images = row_images(row.values, row.where, path.parent)
    marks = placeholder_count([parsed] if isinstance(parsed, str) else [m.content for m in parsed])
    if marks != len(images):
        raise DataError(f"{row.where}: the prompt marks {marks} image(s) ({IMAGE_PLACEHOLDER!r} in its text or "
                        f"image content parts) but the row has {len(images)}; give one mark per image")
    return PromptRecord(
        prompt=template.apply(parsed, row.where) if template is not None else parsed,
        answer=_answer_text(answer, row.where, answer_from),
        data_source=_data_source(row, path),
        index=_index(row, position),
        fields={k: v for k, v in row.values.items()
                if k not in (prompt_key, answer_key, "data_source", "index", "env_class", *IMAGE_COLUMNS)},
        where=row.where,
        env_class=_env_class(row, env_class_check),
        images=images,
    )


def _env_class(row: RawRow, check: EnvClassCheck | None) -> str | None:
    value = row.values.get("env_class")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{row.where}: column 'env_class' must be an environment name or null, got {value!r:.80}")
    problem = check(value) if check is not None else None
    if problem:
        raise DataError(f"{row.where}: env_class {value!r} {problem}")
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
