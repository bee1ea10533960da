"""GSM8K jsonl -> parquet conversion on fixtures the tests write: layout, malformed-row report, errors, atomicity."""

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rl.core.data import DataError, load_prompt_dataset
from rl.tasks.gsm8k.data import final_answer, read_gsm8k_dir, read_gsm8k_jsonl, write_gsm8k

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
GOOD = {"question": "What is 2+3?", "answer": "2+3=<<2+3=5>>5\n#### 5"}
BIG = {"question": "How many?", "answer": "It is 1000+80.\n#### 1,080"}


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_rows(directory: Path, name: str, rows: list[dict]) -> Path:
    return write_lines(directory / name, [json.dumps(row) for row in rows])


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("a\n#### 72", "72"),
        ("a\n#### 1,080", "1080"),
        ("a\n#### -5", "-5"),
        ("a\n#### 2.5", "2.5"),
        ("a\n#### 72\n\n", "72"),
        ("a\n####", None),
        ("a\n#### abc", None),
        ("a\n#### 72 apples", None),
        ("#### 72\nmore text", None),
        ("", None),
    ],
)
def test_final_answer(solution, expected):
    assert final_answer(solution) == expected


def test_malformed_rows_are_reported_with_line_numbers(tmp_path):
    path = write_lines(
        tmp_path / "train.jsonl",
        [
            json.dumps(GOOD),  # 1
            '{"question": "broken',  # 2: bad JSON
            json.dumps({"answer": "#### 3"}),  # 3: no question
            json.dumps({"question": "q", "answer": "no final line"}),  # 4: no '#### N'
            "",  # 5: blank, ignored
            json.dumps(BIG),  # 6
            json.dumps(["a", "list"]),  # 7: not an object
            json.dumps({"question": "q", "answer": "x\n#### abc"}),  # 8: not a number
            json.dumps({"question": 3, "answer": "#### 3"}),  # 9: question not a string
        ],
    )
    split = read_gsm8k_jsonl(path)
    assert [row.line for row in split.malformed] == [2, 3, 4, 7, 8, 9]
    assert [example.line for example in split.examples] == [1, 6]
    assert [example.answer for example in split.examples] == ["5", "1080"]
    reasons = {row.line: row.reason for row in split.malformed}
    assert "JSON" in reasons[2] and "question" in reasons[3] and "####" in reasons[4]


def test_written_parquet_has_the_trainer_layout(tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    write_rows(source, "train.jsonl", [GOOD, BIG])
    write_rows(source, "test.jsonl", [BIG])
    report = write_gsm8k(read_gsm8k_dir(source), tmp_path / "out")
    assert {name: count for name, (_, count) in report.written.items()} == {"train": 2, "validation": 1}
    train = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert train[0] == {
        "prompt": [{"role": "user", "content": "What is 2+3? " + INSTRUCTION}],
        "answer": "5",
        "data_source": "openai/gsm8k",
        "solution": GOOD["answer"],
        "index": 0,
    }
    assert (train[1]["answer"], train[1]["index"]) == ("1080", 1)
    validation = load_prompt_dataset([str(tmp_path / "out" / "validation.parquet")])
    assert validation[0].messages() == [{"role": "user", "content": "How many? " + INSTRUCTION}]
    assert validation[0].answer == "1080"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train.parquet", "validation.parquet"]


def test_index_keeps_the_source_position_when_rows_are_skipped(tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    write_lines(source / "train.jsonl", ["not json", json.dumps(GOOD)])
    write_rows(source, "test.jsonl", [GOOD])
    write_gsm8k(read_gsm8k_dir(source), tmp_path / "out")
    assert pq.read_table(tmp_path / "out" / "train.parquet").column("index").to_pylist() == [1]


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_empty_input_is_an_error(tmp_path, content):
    path = tmp_path / "train.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.jsonl: holds no rows"):
        read_gsm8k_jsonl(path)


def test_all_rows_malformed_is_an_error(tmp_path):
    path = write_lines(tmp_path / "test.jsonl", ["nope", "{}"])
    with pytest.raises(DataError, match=r"none of its 2 rows is well formed.*line 1"):
        read_gsm8k_jsonl(path)


def test_unreadable_input_is_an_error(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\xff\xfe\x00 not utf-8")
    with pytest.raises(DataError, match="cannot read as UTF-8"):
        read_gsm8k_jsonl(path)


def test_missing_input_dir_and_missing_file_are_named(tmp_path):
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'nowhere'}: no such directory")):
        read_gsm8k_dir(tmp_path / "nowhere")
    write_rows(tmp_path, "train.jsonl", [GOOD])
    with pytest.raises(DataError, match=r"test\.jsonl: no such file"):
        read_gsm8k_dir(tmp_path)


def test_output_dir_that_is_a_file_is_an_error(tmp_path):
    write_rows(tmp_path, "train.jsonl", [GOOD])
    write_rows(tmp_path, "test.jsonl", [GOOD])
    blocker = tmp_path / "out"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(DataError, match="is not a directory"):
        write_gsm8k(read_gsm8k_dir(tmp_path), blocker)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    write_rows(tmp_path, "train.jsonl", [GOOD])
    write_rows(tmp_path, "test.jsonl", [GOOD])
    out = tmp_path / "out"
    write_gsm8k(read_gsm8k_dir(tmp_path), out)
    before = (out / "train.parquet").read_bytes()

    def fail(table, where, **kwargs):
        Path(where).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", fail)
    write_rows(tmp_path, "train.jsonl", [BIG, GOOD])
    with pytest.raises(DataError, match="disk full"):
        write_gsm8k(read_gsm8k_dir(tmp_path), out)
    assert (out / "train.parquet").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["train.parquet", "validation.parquet"]
