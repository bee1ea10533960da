"""The embedded tokenizer: exact round trips on task text, identical ids after save/load, the chat format."""

import pytest
from transformers import AutoTokenizer

from rl.tasks.embedded.task import make_task_rows
from rl.tasks.embedded.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def task_strings(tokenizer):
    rows = make_task_rows(300, 0, "train") + make_task_rows(100, 0, "validation")
    chat = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows]
    texts = [row["prompt"][0]["content"] for row in rows]
    return texts + chat + [row["reference_response"] for row in rows] + [row["careless_response"] for row in rows]


def test_vocabulary_is_tiny_and_digits_are_single_tokens(tokenizer):
    assert len(tokenizer) < 64
    ids = tokenizer("0123456789", add_special_tokens=False)["input_ids"]
    assert len(ids) == 10 and len(set(ids)) == 10
    assert len(tokenizer("####", add_special_tokens=False)["input_ids"]) == 1


def test_every_task_string_round_trips_exactly_without_unknown_tokens(tokenizer, task_strings):
    for text in task_strings:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids, text
        assert tokenizer.decode(ids) == text


def test_unknown_characters_become_unk(tokenizer):
    ids = tokenizer("What is ~ ?", add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.unk_token_id) == 1


def test_chat_template_matches_the_format_written_by_hand(tokenizer):
    messages = [{"role": "user", "content": "What is 12 + 3?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|bos|><|user|>What is 12 + 3?<|end|><|assistant|>"
    pieces = ["<|bos|>", "<|user|>", "What", " ", "is", " ", "1", "2", " ", "+", " ", "3", "?", "<|end|>"]
    expected = tokenizer.convert_tokens_to_ids([*pieces, "<|assistant|>"])
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == expected
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert list(encoded["input_ids"]) == expected
    finished = [*messages, {"role": "assistant", "content": "#### 15"}]
    assert tokenizer.apply_chat_template(finished, tokenize=False) == text[: -len("<|assistant|>")] + (
        "<|assistant|>#### 15<|end|>"
    )


def test_special_tokens_are_distinct_and_skipped_on_decode(tokenizer):
    special = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id]
    assert None not in special and len(set(special)) == 4
    ids = tokenizer("#### 7", add_special_tokens=False)["input_ids"]
    framed = [tokenizer.pad_token_id, *ids, tokenizer.eos_token_id]
    assert tokenizer.decode(framed, skip_special_tokens=True) == "#### 7"


def test_save_and_reload_gives_identical_ids(tokenizer, task_strings, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in task_strings[::7]:
        assert (
            reloaded(text, add_special_tokens=False)["input_ids"]
            == tokenizer(text, add_special_tokens=False)["input_ids"]
        )
    messages = [{"role": "user", "content": "What is 40 + 2?"}]
    assert reloaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    )
    assert (reloaded.pad_token_id, reloaded.bos_token_id, reloaded.eos_token_id) == (
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
    )
    assert reloaded.padding_side == "left"
    assert reloaded.get_vocab() == tokenizer.get_vocab()
