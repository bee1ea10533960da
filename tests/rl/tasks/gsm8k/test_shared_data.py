"""Locating the shared GSM8K copy: $RL_SHARED_DIR first, then shared/ beside the repository root; the tests that
read it skip where it is absent, and fail under CI."""

import pytest

from rl.tasks.gsm8k import shared_data
from rl.tasks.gsm8k.shared_data import find_shared_gsm8k, repo_root
from tests.testing import shared_data as testing_shared


def make_gsm8k(shared):
    folder = shared / "data" / "gsm8k"
    folder.mkdir(parents=True)
    for name in ("train.jsonl", "test.jsonl"):
        (folder / name).write_text("{}\n", encoding="utf-8")
    return folder


def test_repo_root_holds_the_workspace_file():
    root = repo_root()
    assert root is not None and (root / "WORKSPACE").is_file()
    assert (root / "rl" / "tasks" / "gsm8k" / "shared_data.py").is_file()


def test_environment_variable_wins(tmp_path, monkeypatch):
    folder = make_gsm8k(tmp_path / "shared")
    monkeypatch.setenv("RL_SHARED_DIR", str(tmp_path / "shared"))
    assert find_shared_gsm8k() == folder


def test_falls_back_beside_the_repo_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RL_SHARED_DIR", str(tmp_path / "empty"))
    (tmp_path / "repo").mkdir()
    folder = make_gsm8k(tmp_path / "shared")
    monkeypatch.setattr(shared_data, "repo_root", lambda: tmp_path / "repo")
    assert find_shared_gsm8k() == folder


def test_absent_data_gives_none(tmp_path, monkeypatch):
    monkeypatch.delenv("RL_SHARED_DIR", raising=False)
    (tmp_path / "repo").mkdir()
    monkeypatch.setattr(shared_data, "repo_root", lambda: tmp_path / "repo")
    assert find_shared_gsm8k() is None


@pytest.mark.parametrize("ci, outcome", [(None, pytest.skip.Exception), ("false", pytest.skip.Exception),
                                         ("true", pytest.fail.Exception), ("TRUE", pytest.fail.Exception)])
def test_absent_data_skips_the_test_but_fails_it_under_ci(tmp_path, monkeypatch, ci, outcome):
    monkeypatch.delenv("RL_SHARED_DIR", raising=False)
    monkeypatch.setattr(shared_data, "repo_root", lambda: tmp_path / "repo")
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="shared/data/gsm8k") as raised:
        testing_shared.shared_gsm8k()
    assert ("../shared must sit beside the checkout" in str(raised.value)) == (outcome is pytest.fail.Exception)


def test_present_data_is_returned_under_ci(tmp_path, monkeypatch):
    folder = make_gsm8k(tmp_path / "shared")
    monkeypatch.setenv("RL_SHARED_DIR", str(tmp_path / "shared"))
    monkeypatch.setenv("CI", "true")
    assert testing_shared.shared_gsm8k() == folder
    assert testing_shared.shared_file(folder, "test.jsonl") == folder / "test.jsonl"
    with pytest.raises(pytest.fail.Exception, match="absent; CI=true"):
        testing_shared.shared_file(folder, "example_model_solutions.jsonl")
