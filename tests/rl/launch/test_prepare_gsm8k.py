"""prepare_gsm8k: the real files converted in place, fixtures with bad rows, the hub fallback, and the flags."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rl
from rl.core.data import DataError
from rl.launch.prepare_gsm8k import prepare
from tests.testing.shared_data import shared_gsm8k

GOOD = {"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}
OTHER = {"question": "And 10*100?", "answer": "10*100=1000\n#### 1,000"}


def write_input(directory: Path, train: list[str], test: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, lines in (("train.jsonl", train), ("test.jsonl", test)):
        (directory / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return directory


def count_lines(path: Path) -> int:
    with path.open(encoding="utf-8") as handle:
        return sum(1 for line in handle if line.strip())


@pytest.fixture(scope="module")
def gsm8k_dir() -> Path:
    return shared_gsm8k()


def test_real_files_convert_with_every_row(gsm8k_dir, tmp_path):
    report = prepare(str(tmp_path / "out"), str(gsm8k_dir))
    expected = {"train": count_lines(gsm8k_dir / "train.jsonl"), "validation": count_lines(gsm8k_dir / "test.jsonl")}
    assert expected == {"train": 7473, "validation": 1319}
    assert {name: count for name, (_, count) in report.written.items()} == expected
    for name, source in (("train", "train.jsonl"), ("validation", "test.jsonl")):
        table = pq.read_table(tmp_path / "out" / f"{name}.parquet")
        assert table.num_rows == expected[name]
        with (gsm8k_dir / source).open(encoding="utf-8") as handle:
            originals = [json.loads(line) for line in handle]
        answers = [row["answer"].split("####")[-1].strip().replace(",", "") for row in originals]
        assert table.column("answer").to_pylist() == answers
        assert table.column("solution").to_pylist() == [row["answer"] for row in originals]
        assert table.column("index").to_pylist() == list(range(expected[name]))
    assert "0 malformed rows" in report.describe()


def test_malformed_rows_are_reported(tmp_path):
    train = [json.dumps(GOOD), "{oops", json.dumps({"question": "q"})]
    source = write_input(tmp_path / "in", train, [json.dumps(GOOD)])
    report = prepare(str(tmp_path / "out"), str(source))
    text = report.describe()
    assert "train: wrote 1 rows" in text and "(2 malformed rows skipped)" in text
    assert "line 2: not valid JSON" in text and "line 3: missing or non-string key(s): answer" in text
    assert "validation: wrote 1 rows" in text


def test_empty_input_file_is_an_error(tmp_path):
    source = write_input(tmp_path / "in", [], [json.dumps(GOOD)])
    with pytest.raises(DataError, match=r"train\.jsonl: holds no rows"):
        prepare(str(tmp_path / "out"), str(source))
    assert not (tmp_path / "out").exists()


def test_missing_input_dir_is_named(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(DataError) as caught:
        prepare(str(tmp_path / "out"), str(missing))
    assert str(missing) in str(caught.value) and "train.jsonl" in str(caught.value)


def test_unreachable_hub_says_to_pass_input(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(DataError, match=r"no network.*pass --input=DIR .*train\.jsonl and test\.jsonl"):
        prepare(str(tmp_path / "out"), None)


def test_missing_datasets_package_says_to_pass_input(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match=r"not installed.*--input=DIR"):
        prepare(str(tmp_path / "out"), None)


def test_hub_rows_go_through_the_same_checks(tmp_path, monkeypatch):
    def load_dataset(name, config):
        assert (name, config) == ("openai/gsm8k", "main")
        return {"train": [GOOD, {"question": "q", "answer": "none"}], "test": [OTHER]}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    report = prepare(str(tmp_path / "out"), None)
    assert {name: count for name, (_, count) in report.written.items()} == {"train": 1, "validation": 1}
    assert "line 2: the answer's last line" in report.describe()
    assert pq.read_table(tmp_path / "out" / "validation.parquet").column("answer").to_pylist() == ["1000"]


def run_binary(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    import_root = str(Path(rl.__file__).parent.parent)
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=os.pathsep.join([import_root, *sys.path]))
    command = [sys.executable, "-m", "rl.launch.prepare_gsm8k", *flags]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_binary_parses_flags_and_expands_home(tmp_path):
    write_input(tmp_path / "in", [json.dumps(GOOD), json.dumps(OTHER)], [json.dumps(OTHER)])
    done = run_binary(tmp_path, "--run_dir=~/out", "--input=~/in")
    assert done.returncode == 0, done.stderr
    assert "train: wrote 2 rows" in done.stdout and "validation: wrote 1 rows" in done.stdout
    assert (tmp_path / "out" / "train.parquet").is_file() and (tmp_path / "out" / "validation.parquet").is_file()


def test_binary_reports_bad_input_and_missing_flags(tmp_path):
    done = run_binary(tmp_path, "--run_dir=~/out", "--input=~/absent")
    assert done.returncode == 2  # refused before anything is written, as every launcher's refusals
    assert f"{tmp_path / 'absent'}: no such directory" in done.stderr
    done = run_binary(tmp_path, "--input=~/absent")
    assert done.returncode == 2 and "--run_dir" in done.stderr
