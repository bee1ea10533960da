"""Locating the shared GSM8K copy: $RL_SHARED_DIR first, then shared/ beside the repository root."""

from rl.tasks.gsm8k import shared_data
from rl.tasks.gsm8k.shared_data import find_shared_gsm8k, repo_root


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
