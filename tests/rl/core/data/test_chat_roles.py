"""Chat roles: a prompt message whose role the chat templates do not render is refused when the data loads, naming
the file, the row and the role, in the RL prompt files and the SFT/DPO files alike."""

from __future__ import annotations

import json

import pytest

from rl.core.data import DataError, load_prompt_dataset
from rl.core.data.readers import RawRow
from rl.core.data.records import CHAT_ROLES
from rl.core.data.supervised import SupervisedDataSpec, preference_pair

ROLES_NAMED = "the roles are system, user, assistant, tool"


def test_the_roles_are_those_qwen_and_llama_templates_render():
    assert CHAT_ROLES == ("system", "user", "assistant", "tool")


def test_every_chat_role_loads(tmp_path):
    path = tmp_path / "a.jsonl"
    messages = [{"role": role, "content": f"{role} text"} for role in CHAT_ROLES]
    path.write_text(json.dumps({"prompt": messages, "answer": "1"}) + "\n")
    [record] = load_prompt_dataset([path])
    assert [m["role"] for m in record.messages()] == list(CHAT_ROLES)


@pytest.mark.parametrize("role", ["narrator", "developer", "function", "User"])
def test_an_unknown_role_is_refused_naming_file_row_and_role(tmp_path, role):
    path = tmp_path / "a.jsonl"
    rows = [{"prompt": "q", "answer": "1"},
            {"prompt": [{"role": "user", "content": "hi"}, {"role": role, "content": "go on"}], "answer": "2"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError) as refused:
        load_prompt_dataset([path])
    assert str(refused.value) == (f"{path} line 2: chat message 1 has unknown role {role!r}; {ROLES_NAMED} (chat "
                                  "templates drop or misrender any other): rename it to one of them")


def test_the_preference_rows_use_the_same_roles():
    row = RawRow("p.jsonl line 4",
                 {"prompt": [{"role": "developer", "content": "Be brief."}], "chosen": "a", "rejected": "b"})
    with pytest.raises(DataError) as refused:
        preference_pair(None, row, SupervisedDataSpec(section="dpo"))  # refused before any tokenizer call
    assert str(refused.value).startswith("p.jsonl line 4: 'prompt' message 0 has unknown role 'developer'; "
                                         + ROLES_NAMED)
