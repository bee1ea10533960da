"""Convert GSM8K's jsonl files (`{"question", "answer"}`, answer ending `#### N`) into the trainer's parquet layout.

Output columns: `prompt` (one user chat message: the question plus `GSM8K_INSTRUCTION`), `answer` (the final
number, thousands separators removed), `data_source` (`GSM8K_DATA_SOURCE`), `solution` (the full reference
solution) and `index` (the row's 0-based position in its source). train.jsonl becomes train.parquet and test.jsonl
becomes validation.parquet. Malformed rows are skipped and reported with their 1-based line numbers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rl.core.data.errors import DataError
from rl.core.data.parquet_io import write_parquet_atomic

GSM8K_DATA_SOURCE = "openai/gsm8k"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
# Output split name -> (source jsonl name, output parquet name).
SPLIT_FILES = {"train": ("train.jsonl", "train.parquet"), "validation": ("test.jsonl", "validation.parquet")}
FINAL_LINE = re.compile(r"####\s*(?P<number>-?\d[\d,]*(?:\.\d+)?)\s*")
MAX_LISTED_MALFORMED = 20


@dataclass(frozen=True)
class Gsm8kExample:
    line: int
    question: str
    solution: str
    answer: str


@dataclass(frozen=True)
class MalformedRow:
    line: int
    reason: str


@dataclass(frozen=True)
class Gsm8kSplit:
    """The well-formed examples of one source file, and the rows that were not."""

    source: str
    examples: tuple[Gsm8kExample, ...]
    malformed: tuple[MalformedRow, ...]


def final_answer(solution: str) -> str | None:
    """The number on the solution's last non-blank line `#### N` (commas removed), or None if there is none."""
    lines = solution.strip().splitlines()
    match = FINAL_LINE.fullmatch(lines[-1].strip()) if lines else None
    return match.group("number").replace(",", "") if match else None


def parse_records(records: Iterable[tuple[int, object]], source: str) -> Gsm8kSplit:
    """Check (1-based line, record) pairs; a record that is not a dict with the two string keys is malformed."""
    examples, malformed = [], []
    for line, record in records:
        parsed = _parse_record(line, record)
        (examples if isinstance(parsed, Gsm8kExample) else malformed).append(parsed)
    if not examples and not malformed:
        raise DataError(f"{source}: holds no rows; pass a GSM8K jsonl file with one question per line")
    if not examples:
        first = _describe(malformed[0])
        raise DataError(f"{source}: none of its {len(malformed)} rows is well formed (first: {first})")
    return Gsm8kSplit(source=source, examples=tuple(examples), malformed=tuple(malformed))


def _parse_record(line: int, record: object) -> Gsm8kExample | MalformedRow:
    if isinstance(record, MalformedRow):
        return record
    if not isinstance(record, Mapping):
        return MalformedRow(line, f"expected a JSON object, got {type(record).__name__}")
    question, solution = record.get("question"), record.get("answer")
    missing = [key for key, value in (("question", question), ("answer", solution)) if not isinstance(value, str)]
    if missing:
        return MalformedRow(line, f"missing or non-string key(s): {', '.join(missing)}")
    answer = final_answer(solution)
    if answer is None:
        return MalformedRow(line, "the answer's last line is not '#### <number>'")
    return Gsm8kExample(line=line, question=question, solution=solution, answer=answer)


def read_gsm8k_jsonl(path: str | Path) -> Gsm8kSplit:
    """Parse one GSM8K jsonl file; blank lines are ignored, bad JSON counts as a malformed row."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; GSM8K input must hold train.jsonl and test.jsonl") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot read as UTF-8 text ({err})") from None
    lines = ((number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip())
    return parse_records(((number, _decode(number, line)) for number, line in lines), str(path))


def _decode(number: int, line: str) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        return MalformedRow(number, f"not valid JSON ({err.msg})")


def read_gsm8k_dir(input_dir: str | Path) -> dict[str, Gsm8kSplit]:
    """Read train.jsonl and test.jsonl from a local GSM8K copy, keyed by output split name."""
    directory = Path(input_dir).expanduser()
    if not directory.is_dir():
        raise DataError(f"--input {directory}: no such directory; pass a folder holding train.jsonl and test.jsonl")
    return {split: read_gsm8k_jsonl(directory / source) for split, (source, _) in SPLIT_FILES.items()}


def to_rows(split: Gsm8kSplit) -> list[dict[str, object]]:
    """The parquet rows of one split, in the trainer's layout."""
    return [
        {
            "prompt": [{"role": "user", "content": f"{example.question} {GSM8K_INSTRUCTION}"}],
            "answer": example.answer,
            "data_source": GSM8K_DATA_SOURCE,
            "solution": example.solution,
            "index": example.line - 1,
        }
        for example in split.examples
    ]


def parquet_schema():
    """The pyarrow schema of the written files (explicit, so an all-null column never changes type)."""
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema(
        [
            ("prompt", pa.list_(message)),
            ("answer", pa.string()),
            ("data_source", pa.string()),
            ("solution", pa.string()),
            ("index", pa.int64()),
        ]
    )


@dataclass(frozen=True)
class PrepareReport:
    """What `write_gsm8k` wrote: output path and row count per split, and the malformed rows skipped."""

    written: dict[str, tuple[Path, int]]
    splits: dict[str, Gsm8kSplit]

    def describe(self) -> str:
        lines = []
        for name, (path, count) in self.written.items():
            split = self.splits[name]
            lines.append(f"{name}: wrote {count} rows to {path} ({len(split.malformed)} malformed rows skipped)")
            lines.extend(f"  {split.source} {_describe(row)}" for row in split.malformed[:MAX_LISTED_MALFORMED])
            if len(split.malformed) > MAX_LISTED_MALFORMED:
                lines.append(f"  ... and {len(split.malformed) - MAX_LISTED_MALFORMED} more")
        return "\n".join(lines)


def write_gsm8k(splits: Mapping[str, Gsm8kSplit], output_dir: str | Path) -> PrepareReport:
    """Write each split to `output_dir/<split>.parquet` atomically; all splits are parsed before any is written."""
    directory = Path(output_dir).expanduser()
    if directory.exists() and not directory.is_dir():
        raise DataError(f"--run_dir {directory}: exists and is not a directory; pass a folder path")
    written = {}
    for name, split in splits.items():
        path = directory / SPLIT_FILES[name][1]
        write_parquet_atomic(to_rows(split), path, schema=parquet_schema())
        written[name] = (path, len(split.examples))
    return PrepareReport(written=written, splits=dict(splits))


def _describe(row: MalformedRow) -> str:
    return f"line {row.line}: {row.reason}"
