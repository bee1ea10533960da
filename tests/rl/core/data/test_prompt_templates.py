"""Prompt templates (data.prompt_template_file, data.system_prompt_file; NeMo RL's prompt_file and
system_prompt_file): the chat each row's problem becomes, written out by hand, and the files refused when the config
loads, naming the key and the path."""

from __future__ import annotations

import json

import pytest

import rl.backends.registry  # noqa: F401  (the strategies' blocks are keys of ours)
from rl.core.config import ConfigError, load_config
from rl.core.data import ChatMessage, DataError, load_prompt_dataset, load_prompt_template

# A template in NeMo RL's style: literal braces doubled (str.format), a backslash kept as written, no final newline.
TEMPLATE = "Work it out, then give the result as \\\\boxed{{}}:\n{}\n\nShow each step"
SYSTEM = "You are a careful tutor.\n"


def write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def rows_file(tmp_path, rows: list) -> str:
    return write(tmp_path / "rows.jsonl", "".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture
def files(tmp_path):
    return write(tmp_path / "cot.txt", TEMPLATE), write(tmp_path / "system.txt", SYSTEM)


def test_text_and_one_user_message_become_system_and_templated_user(tmp_path, files):
    path = rows_file(tmp_path, [
        {"prompt": "What is 2+2?", "answer": "4"},
        {"prompt": [{"role": "user", "content": "Solve {x} = 3."}], "answer": "3"},  # braces of a problem stay
        {"messages": [{"role": "user", "content": "What is 1+5?"}, {"role": "assistant", "content": "6"}]},
    ])
    dataset = load_prompt_dataset([path], template=load_prompt_template(*files))
    system = ChatMessage("system", "You are a careful tutor.\n")
    head, tail = "Work it out, then give the result as \\\\boxed{}:\n", "\n\nShow each step"
    assert [record.prompt for record in dataset] == [
        (system, ChatMessage("user", head + "What is 2+2?" + tail)),
        (system, ChatMessage("user", head + "Solve {x} = 3." + tail)),
        (system, ChatMessage("user", head + "What is 1+5?" + tail)),
    ]
    assert [record.answer for record in dataset] == ["4", "3", "6"]
    assert dataset[0].messages()[1] == {"role": "user", "content": dataset[0].prompt[1].content}


def test_either_file_alone(tmp_path, files):
    system = files[1]
    path = rows_file(tmp_path, [{"prompt": "What is 2+2?", "answer": "4"}])
    only_system = load_prompt_dataset([path], template=load_prompt_template(None, system))
    assert only_system[0].prompt == (ChatMessage("system", SYSTEM), ChatMessage("user", "What is 2+2?"))
    only_template = load_prompt_dataset([path], template=load_prompt_template(write(tmp_path / "t.txt", "Q: {0}"),
                                                                               None))
    assert only_template[0].prompt == (ChatMessage("user", "Q: What is 2+2?"),)
    assert load_prompt_template(None, None) is None
    assert load_prompt_dataset([path])[0].prompt == "What is 2+2?"  # no template: as the data holds it


def test_a_conversation_is_refused_naming_the_row(tmp_path, files):
    path = rows_file(tmp_path, [
        {"prompt": "What is 2+2?", "answer": "4"},
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+3?"}], "answer": "6"},
    ])
    with pytest.raises(DataError) as info:
        load_prompt_dataset([path], template=load_prompt_template(*files))
    message = str(info.value)
    assert "rows.jsonl line 2:" in message and "chat of 2 messages (system, user)" in message
    assert "data.prompt_template_file" in message and "set both keys to null" in message


def _problems(overrides) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(list(overrides))
    return [line for line in info.value.problems if line.startswith(("data.prompt_template_file",
                                                                     "data.system_prompt_file"))]


@pytest.mark.parametrize("text, fragment", [
    ("No place for the problem", "has no {} where the problem goes"),
    ("{} and again {}", "has the placeholders {}, {}; it needs exactly one {}"),
    ("Problem: {problem}", "has the placeholders {problem}"),
    ("Answer in \\boxed{}: {}", "has the placeholders {}, {}"),  # a brace NeMo RL's cot.txt writes doubled
    ("Answer}: {}", "Single '}' encountered"),
    ("  \n", "is empty"),
])
def test_bad_templates_are_refused_when_the_config_loads(tmp_path, text, fragment):
    path = write(tmp_path / "bad.txt", text)
    (line,) = _problems([f"data.prompt_template_file={path}"])
    assert line.startswith(f"data.prompt_template_file: {path} ") and fragment in line, line


def test_unreadable_files_are_refused_naming_key_and_path(tmp_path, monkeypatch):
    (tmp_path / "latin1.txt").write_bytes("Caf\xe9 {}".encode("latin-1"))
    monkeypatch.chdir(tmp_path)
    lines = _problems(["data.prompt_template_file=prompts/cot.txt", "data.system_prompt_file=latin1.txt"])
    assert lines == [
        f"data.prompt_template_file: prompts/cot.txt (read as {tmp_path}/prompts/cot.txt) does not exist; give the "
        "path of the file (a relative path is read from the working directory) or null for none",
        f"data.system_prompt_file: latin1.txt (read as {tmp_path}/latin1.txt) is not UTF-8 text (invalid "
        "continuation byte at byte 3); save it as UTF-8",
    ]
    assert _problems([f"data.system_prompt_file={tmp_path}"])[0].endswith("is a directory; give the path of a text "
                                                                         "file")


def test_relative_paths_are_read_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "prompts").mkdir()
    write(tmp_path / "prompts" / "cot.txt", "Q: {}")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(["data.prompt_template_file=prompts/cot.txt", "data.system_prompt_file=null"])
    assert cfg.data.prompt_template_file == "prompts/cot.txt"
    assert load_prompt_template(cfg.data.prompt_template_file, None).user == "Q: {}"
    # under `bazel run` the directory bazel was run from, not the runfiles the process starts in
    monkeypatch.chdir("/")
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(tmp_path))
    assert load_prompt_template("prompts/cot.txt", None).user == "Q: {}"


def test_defaults_are_null():
    cfg = load_config([])
    assert (cfg.data.prompt_template_file, cfg.data.system_prompt_file) == (None, None)


def test_a_system_prompt_needs_no_placeholder(files):
    """Only the template must hold its one `{}`: a system prompt without one loads as it is."""
    cfg = load_config([f"data.system_prompt_file={files[1]}"])
    assert cfg.data.system_prompt_file == files[1]
