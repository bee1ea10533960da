"""Prompt encoding (`rl.trainer.rollout.prompt_encoding`): data.truncation's cuts, the warnings once per row, the step
count, the refusals before training, and the unknown-token warning. Expected ids come from the embedded tokenizer's
vocabulary table (one id per piece), written out by hand, not from the tokenizer."""

from __future__ import annotations

import json

import pytest

import rl.backends.registry  # noqa: F401  (the strategies a config names)
from rl.core.config import ConfigError, load_config
from rl.core.data.records import PromptRecord, parse_prompt
from rl.tasks.embedded.tokenizer import build_tokenizer, vocabulary
from rl.trainer.rollout.prompt_encoding import (
    UNKNOWN_SHARE_WARNING,
    PromptEncoder,
    prompt_problems,
    refuse_at_start,
    render_ids,
    truncate,
)

VOCAB = vocabulary()


def _ids(*pieces: str) -> list[int]:
    return [VOCAB[piece] for piece in pieces]


# "What is 12 + 34?": one id per word, space, digit and symbol
QUESTION = ("What", " ", "is", " ", "1", "2", " ", "+", " ", "3", "4", "?")


def _record(prompt, line: int = 1) -> PromptRecord:
    where = f"a.jsonl line {line}"
    return PromptRecord(parse_prompt(prompt, where), "1", "a", line - 1, where=where)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _cfg(*overrides: str):
    return load_config(list(overrides))


@pytest.mark.parametrize(("truncation", "max_length", "kept"), [
    ("left", 4, [6, 7, 8, 9]),
    ("right", 4, [0, 1, 2, 3]),
    ("middle", 4, [0, 1, 8, 9]),
    ("middle", 5, [0, 1, 7, 8, 9]),  # veRL's split: max // 2 first, the rest last
    ("left", 10, list(range(10))),
    ("error", 4, list(range(10))),  # never cut: refused before
])
def test_truncate_keeps_the_side_data_truncation_names(truncation, max_length, kept):
    assert truncate(list(range(10)), max_length, truncation) == kept


def test_text_and_chat_prompts_are_encoded_as_the_vocabulary_says(tokenizer):
    assert render_ids(tokenizer, _record("What is 12 + 34?")) == _ids(*QUESTION)
    chat = _record([{"role": "user", "content": "What is 12 + 34?"}])
    assert render_ids(tokenizer, chat) == _ids("<|bos|>", "<|user|>", *QUESTION, "<|end|>", "<|assistant|>")


def test_a_cut_row_is_warned_once_and_counted_each_time(tokenizer):
    lines = []
    encoder = PromptEncoder(tokenizer, 5, "left", log=lines.append)
    long, short = _record("What is 12 + 34?", 3), _record("What is 1", 4)  # 12 and 5 tokens
    assert encoder.encode_all([long, short]) == [_ids("+", " ", "3", "4", "?"), _ids("What", " ", "is", " ", "1")]
    assert encoder.encode(long) == _ids("+", " ", "3", "4", "?")  # again: the same cut, no second warning
    assert lines == ["warning: the prompt of a.jsonl line 3 has 12 tokens, more than generator.max_prompt_length=5; "
                     "cut to it (data.truncation=left)"]
    assert encoder.truncated_count([long, short, long]) == 2


def test_right_truncation_keeps_the_first_tokens(tokenizer):
    encoder = PromptEncoder(tokenizer, 5, "right", log=lambda _: None)
    assert encoder.encode(_record("What is 12 + 34?")) == _ids("What", " ", "is", " ", "1")


def test_error_refuses_a_long_prompt_naming_the_row(tokenizer):
    encoder = PromptEncoder(tokenizer, 5, "error", log=lambda _: None)
    assert encoder.encode(_record("What is 1")) == _ids("What", " ", "is", " ", "1")  # 5 tokens: fits
    with pytest.raises(ConfigError) as refused:
        encoder.encode(_record("What is 12 + 34?", 7))
    assert refused.value.problems == [
        "data.truncation: the prompt of a.jsonl line 7 has 12 tokens, more than generator.max_prompt_length=5; raise "
        "generator.max_prompt_length, shorten the prompt, or set data.truncation to left, right or middle to cut such "
        "prompts"]


def test_a_prompt_mostly_unknown_to_the_tokenizer_is_warned_once(tokenizer):
    lines = []
    encoder = PromptEncoder(tokenizer, 128, "left", log=lines.append)
    # one unknown word in 20 tokens is the threshold itself (not above it); in 18 tokens it is above
    at_threshold = _record("Zed" + " 1" * 9 + "?", 1)
    above = _record("Zed" + " 1" * 8 + "?", 2)
    assert len(encoder.encode(at_threshold)) == 20 and UNKNOWN_SHARE_WARNING == 1 / 20
    assert lines == []
    ids = encoder.encode(above)
    assert ids[0] == VOCAB["<|unk|>"] and len(ids) == 18
    encoder.encode(above)
    assert lines == ["warning: 1 of the 18 tokens of the prompt of a.jsonl line 2 are the tokenizer's unknown token "
                     "<|unk|>, which the model cannot read; check the row's text and encoding, or use a tokenizer "
                     "that covers it"]


def test_a_tokenizer_without_an_unknown_token_counts_nothing():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(["What is 12 + 34?"], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    byte_level = PreTrainedTokenizerFast(tokenizer_object=backend)
    lines = []
    encoder = PromptEncoder(byte_level, 128, "left", log=lines.append)
    assert encoder.unk_id is None
    assert len(encoder.encode(_record("Ωμέγα 😀 ∑"))) > 0 and lines == []


def test_truncation_error_names_the_first_long_row_and_the_count(tokenizer):
    cfg = _cfg("data.truncation=error", "generator.max_prompt_length=8")
    records = [_record("What is 1?", 1), _record("What is 12 + 34?", 2), _record("What is 12 + 345?", 3)]
    assert prompt_problems(cfg, tokenizer, {"data.train_data": records, "data.val_data": None}, None) == [
        "data.truncation: the prompt of a.jsonl line 2 has 12 tokens, more than generator.max_prompt_length=8; raise "
        "generator.max_prompt_length, shorten the prompt, or set data.truncation to left, right or middle to cut such "
        "prompts (2 of the 3 prompts of data.train_data are longer)"]


def test_a_prompt_without_room_within_the_positions_is_refused(tokenizer):
    cfg = _cfg("generator.max_prompt_length=16", "generator.max_generate_length=10")
    records = [_record("What is 1?", 1), _record("What is 12 + 34?", 2)]  # 6 and 12 tokens; room: 20 - 10 = 10
    assert prompt_problems(cfg, tokenizer, {"data.val_data": records}, 20) == [
        "generator.max_prompt_length: the prompt of a.jsonl line 2 has 12 tokens; with "
        "generator.max_generate_length=10 it needs 22 positions, more than the model's max_position_embeddings=20; "
        "lower generator.max_generate_length to 8, lower generator.max_prompt_length to 10 (longer prompts are then "
        "cut as data.truncation says) or shorten the prompt (1 of the 2 prompts of data.val_data leave no room)"]
    cut = _cfg("generator.max_prompt_length=11", "generator.max_generate_length=10")  # 12 tokens cut to 11
    [line] = prompt_problems(cut, tokenizer, {"data.train_data": records}, 20)
    assert ("has 11 tokens (cut to generator.max_prompt_length); with generator.max_generate_length=10 it needs 21"
            in line)
    filled = _cfg("generator.max_prompt_length=16", "generator.max_generate_length=20")  # no prompt length fits
    [line] = prompt_problems(filled, tokenizer, {"data.train_data": records[:1]}, 20)
    assert line.endswith("more than the model's max_position_embeddings=20; lower generator.max_generate_length to 14 "
                         "or shorten the prompt (1 of the 1 prompts of data.train_data leave no room)")


def test_nothing_is_encoded_when_every_cut_prompt_fits(tokenizer):
    class Unreadable:
        def __iter__(self):
            raise AssertionError("the prompts were encoded")

    fits = _cfg("generator.max_prompt_length=10", "generator.max_generate_length=10")
    assert prompt_problems(fits, tokenizer, {"data.train_data": Unreadable()}, 20) == []
    multi_turn = _cfg("generator.max_prompt_length=16", "generator.max_generate_length=10",
                      "environment.env_class=arith_retry")  # episodes check their own context
    assert prompt_problems(multi_turn, tokenizer, {"data.train_data": Unreadable()}, 20) == []


def test_a_model_built_at_the_start_is_checked_when_the_trainer_starts(tokenizer, tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=len(VOCAB), max_position_embeddings=16).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["max_position_embeddings"] == 16
    cfg = _cfg("generator.max_generate_length=8")  # the embedded model: built at the start
    long = [_record("What is 12 + 34?", 5)]  # 12 tokens + 8 > 16
    with pytest.raises(ConfigError) as refused:
        refuse_at_start(cfg, tokenizer, {"data.train_data": long, "data.val_data": None}, str(tmp_path))
    [line] = refused.value.problems
    assert line.startswith("generator.max_prompt_length: the prompt of a.jsonl line 5 has 12 tokens; with "
                           "generator.max_generate_length=8 it needs 20 positions, more than the model's "
                           "max_position_embeddings=16")
    refuse_at_start(cfg, tokenizer, {"data.train_data": [_record("What is 1?")]}, str(tmp_path))  # 6 + 8 fits
