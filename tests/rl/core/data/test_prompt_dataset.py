"""Loading prompt datasets from parquet and jsonl files the tests write, and the errors for bad input."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl.core.data import ChatMessage, DataError, PromptRecord, load_prompt_dataset

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, columns: dict) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_jsonl_text_and_chat_prompts(tmp_path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [{"prompt": "Say hi", "answer": "hi"}, {"prompt": CHAT, "answer": 4}])
    dataset = load_prompt_dataset([str(path)])
    assert len(dataset) == 2
    assert dataset[0] == PromptRecord(prompt="Say hi", answer="hi", data_source="mixed", index=0)
    chat = dataset[1]
    assert chat.prompt == (ChatMessage("system", "Be brief."), ChatMessage("user", "What is 2+2?"))
    assert chat.answer == "4"
    assert chat.index == 1
    assert chat.messages() == CHAT
    assert dataset[0].messages() == [{"role": "user", "content": "Say hi"}]
    assert not dataset[0].is_chat and chat.is_chat


def test_parquet_with_chat_prompts_and_optional_columns(tmp_path):
    path = write_parquet(
        tmp_path / "train.parquet",
        {
            "prompt": [CHAT, [{"role": "user", "content": "1+1?"}]],
            "answer": ["4", "2"],
            "data_source": ["openai/gsm8k", "openai/gsm8k"],
            "index": [10, 11],
            "solution": ["ignored", "ignored"],
        },
    )
    dataset = load_prompt_dataset([str(path)])
    assert [record.index for record in dataset] == [10, 11]
    assert {record.data_source for record in dataset} == {"openai/gsm8k"}
    assert dataset[1].messages() == [{"role": "user", "content": "1+1?"}]
    assert [record.answer for record in dataset] == ["4", "2"]


def test_files_are_concatenated_in_order(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "p0", "answer": "0"}])
    second = write_parquet(tmp_path / "b.parquet", {"prompt": ["p1", "p2"], "answer": ["1", "2"]})
    dataset = load_prompt_dataset([str(first), str(second)])
    assert [record.prompt for record in dataset] == ["p0", "p1", "p2"]
    assert [record.data_source for record in dataset] == ["a", "b", "b"]
    assert dataset.files == (str(first), str(second))


def test_custom_keys(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "2*3?", "target": "6"}])
    dataset = load_prompt_dataset([str(path)], prompt_key="question", answer_key="target")
    assert (dataset[0].prompt, dataset[0].answer) == ("2*3?", "6")


def test_home_directory_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_jsonl(tmp_path / "home.jsonl", [{"prompt": "p", "answer": "a"}])
    assert len(load_prompt_dataset(["~/home.jsonl"])) == 1


def test_blank_lines_in_jsonl_are_skipped(tmp_path):
    path = tmp_path / "gaps.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": "2"}\n', encoding="utf-8")
    assert [record.prompt for record in load_prompt_dataset([str(path)])] == ["a", "b"]


def test_missing_column_names_the_key_the_file_and_the_columns_found(tmp_path):
    path = write_parquet(tmp_path / "nokey.parquet", {"question": ["q"], "answer": ["1"]})
    with pytest.raises(DataError) as caught:
        load_prompt_dataset([str(path)])
    message = str(caught.value)
    assert "'prompt'" in message and str(path) in message
    assert "answer, question" in message and "prompt_key" in message


def test_missing_key_in_jsonl_names_the_line(tmp_path):
    path = write_jsonl(tmp_path / "partial.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b"}])
    with pytest.raises(DataError, match=r"partial\.jsonl line 2: no column 'answer'"):
        load_prompt_dataset([str(path)])


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"absent\.parquet: no such file"):
        load_prompt_dataset([str(tmp_path / "absent.parquet")])


@pytest.mark.parametrize("name", ["empty.jsonl", "blank.jsonl"])
def test_empty_jsonl_is_an_error(tmp_path, name):
    path = tmp_path / name
    path.write_text("" if name == "empty.jsonl" else "\n\n", encoding="utf-8")
    with pytest.raises(DataError, match="holds no rows"):
        load_prompt_dataset([str(path)])


def test_empty_parquet_is_an_error(tmp_path):
    schema = pa.schema([("prompt", pa.string()), ("answer", pa.string())])
    path = tmp_path / "empty.parquet"
    pq.write_table(schema.empty_table(), path)
    with pytest.raises(DataError, match=r"empty\.parquet: the file holds no rows"):
        load_prompt_dataset([str(path)])


def test_no_paths_is_an_error():
    with pytest.raises(DataError, match="no prompt files given"):
        load_prompt_dataset([])


def test_unsupported_extension(tmp_path):
    path = tmp_path / "prompts.csv"
    path.write_text("prompt,answer\nq,1\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"unsupported file extension '\.csv'.*\.jsonl, \.parquet"):
        load_prompt_dataset([str(path)])


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"this is not parquet")
    with pytest.raises(DataError, match=r"broken\.parquet: cannot read as parquet"):
        load_prompt_dataset([str(path)])


def test_bad_json_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl line 2: not valid JSON"):
        load_prompt_dataset([str(path)])


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"prompt": "a", "answer": None}, "'answer' is null"),
        ({"prompt": "", "answer": "1"}, "empty string"),
        ({"prompt": 5, "answer": "1"}, "must be text or a non-empty list"),
        ({"prompt": [], "answer": "1"}, "must be text or a non-empty list"),
        ({"prompt": [{"role": "user"}], "answer": "1"}, "chat message 0"),
        ({"prompt": "a", "answer": ["1"]}, "'answer' must be a string or number"),
        ({"prompt": "a", "answer": "1", "index": "7"}, "'index' must be an integer"),
        ({"prompt": "a", "answer": "1", "data_source": 3}, "'data_source' must be a string"),
        ({"prompt": "a", "answer": "  "}, "'answer' is an empty string"),
        ({"prompt": "a", "answer": float("nan")}, "'answer' is nan; every row needs a finite reference answer"),
        ({"prompt": [{"role": "user", "content": ""}], "answer": "1"}, r"chat message 0 \(user\) has empty content"),
    ],
)
def test_invalid_cells_name_the_row(tmp_path, row, match):
    path = write_jsonl(tmp_path / "cells.jsonl", [row])
    with pytest.raises(DataError, match=match) as caught:
        load_prompt_dataset([str(path)])
    assert "cells.jsonl line 1" in str(caught.value)


def test_unicode_line_breaks_inside_json_strings_stay_in_the_row(tmp_path):
    """JSON allows U+2028, U+2029, U+0085 and form feeds raw inside strings; only "\\n" ends a JSON Lines record
    (an "\\r" before it is the Windows ending)."""
    text = "What is 1 + 1?\u2028Think\u2029then\x85answer\x0c."
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": text, "answer": "2"}, ensure_ascii=False) + "\r\n" +
                    json.dumps({"prompt": "2 + 2?", "answer": "4"}) + "\n", encoding="utf-8")
    first, second = load_prompt_dataset([str(path)])
    assert first.prompt == text and first.answer == "2"
    assert second.answer == "4" and second.where.endswith("line 2")
