"""Prompt files laid out as SkyRL's GSM8K preparation script writes them (examples/train/gsm8k/gsm8k_dataset.py:
`data_source`, a chat `prompt`, `env_class`, `reward_spec` = {method, ground_truth}, `extra_info`) and as NeMo RL
stores math data (`messages`: the problem, then the answer as the assistant's message) load unchanged: the answer
comes from reward_spec.ground_truth (or the last message), the row's env_class comes through, and bad rows are
refused naming the file and row."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl.core.data import DataError, load_prompt_dataset

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def skyrl_row(index: int, question: str, solution: str, env_class: str = "gsm8k") -> dict:
    """One row exactly as gsm8k_dataset.py's process_fn builds it."""
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "env_class": env_class,
        "reward_spec": {"method": "rule", "ground_truth": solution},
        "extra_info": {"split": "train", "index": index, "answer": f"work... #### {solution}", "question": question},
    }


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_skyrl_parquet_loads_with_answer_and_env_class(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", [
        skyrl_row(0, "Natalia sold 48 clips in April and half as many in May. How many in all?", "72"),
        skyrl_row(1, "Weng earns $12 an hour. How much for 50 minutes?", "10", env_class="gsm8k_multi_turn"),
    ])
    seen = []
    dataset = load_prompt_dataset([path], env_class_check=lambda name: seen.append(name))
    first, second = dataset
    assert (first.answer, second.answer) == ("72", "10")
    assert (first.env_class, second.env_class) == ("gsm8k", "gsm8k_multi_turn") == tuple(seen)
    assert first.data_source == "openai/gsm8k" and first.index == 0
    question = "Natalia sold 48 clips in April and half as many in May. How many in all?"
    assert first.messages() == [{"role": "user", "content": f"{question} {INSTRUCTION}"}]
    # The row's other columns stay at hand for environments and reward functions (gsm8k_multi_turn's extra_info).
    assert first.fields["reward_spec"] == {"method": "rule", "ground_truth": "72"}
    assert first.fields["extra_info"]["question"].startswith("Natalia") and "env_class" not in first.fields


def test_an_answer_column_wins_and_rows_without_env_class_have_none(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "1+1?", "answer": "2", "reward_spec": {"ground_truth": "3"}}) + "\n")
    [record] = load_prompt_dataset([path])
    assert (record.answer, record.env_class) == ("2", None)


def test_a_row_with_no_answer_anywhere_is_refused_naming_file_and_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": "1+1?", "reward_spec": {"ground_truth": "2"}},
            {"prompt": "2+2?", "reward_spec": {"method": "rule"}}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    expected = f"{path} line 2: no column 'answer' and no reward_spec.ground_truth, so no answer"
    with pytest.raises(DataError, match=re.escape(expected)):
        load_prompt_dataset([path])
    parquet = write_parquet(tmp_path / "null.parquet", [skyrl_row(0, "q", "1"), skyrl_row(1, "q", None)])
    with pytest.raises(DataError, match=re.escape(f"{parquet} row 1: reward_spec.ground_truth is null")):
        load_prompt_dataset([parquet])


def test_an_unknown_env_class_is_refused_naming_file_and_row(tmp_path):
    rows = [skyrl_row(0, "q", "1"), skyrl_row(1, "q", "2", "gsm8k_multiturn")]
    path = write_parquet(tmp_path / "train.parquet", rows)

    def check(name: str) -> str | None:
        return None if name == "gsm8k" else "is unknown here; fix the row"

    expected = f"{path} row 1: env_class 'gsm8k_multiturn' is unknown here; fix the row"
    with pytest.raises(DataError, match=re.escape(expected)):
        load_prompt_dataset([path], env_class_check=check)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "q", "answer": "1", "env_class": 3}) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{bad} line 1: column 'env_class' must be an environment name")):
        load_prompt_dataset([bad])


def test_nemo_rl_math_rows_load(tmp_path):
    """NeMo RL's ResponseDataset rows (`messages` = [user problem, assistant answer]), which its
    math_hf_data_processor reads as problem = messages[0].content, ground truth = messages[1].content."""
    path = tmp_path / "math.jsonl"
    rows = [{"messages": [{"role": "user", "content": "Compute 6 * 7."}, {"role": "assistant", "content": "42"}],
             "task_name": "math"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    [record] = load_prompt_dataset([path])
    assert (record.messages(), record.answer) == ([{"role": "user", "content": "Compute 6 * 7."}], "42")
    assert record.fields["task_name"] == "math"
    lone = tmp_path / "lone.jsonl"
    lone.write_text(json.dumps({"messages": [{"role": "assistant", "content": "42"}]}) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{lone} line 1: no column 'prompt'")):
        load_prompt_dataset([lone])
