"""Supervised (SFT) and preference (DPO) examples: rows read from parquet/jsonl files, checked and tokenized once.

SFT rows are chat conversations (a list of {role, content} messages under `messages_key`, SkyRL's key) or a
prompt and a response (`prompt_key`: text or a list of messages, `response_key`: text). The chat template is
applied once per row; the loss mask covers the tokens of every assistant turn (its content and the end-of-turn
token the template writes), found by rendering the conversation up to each turn. Preference rows hold a prompt and
two responses (`chosen_key`, `rejected_key`); each becomes prompt + response with the response in the loss.

Every problem is a `DataError` naming the file and row and the key that fixes it, raised before training starts: a
conversation without an assistant turn, an unknown role, a pair whose chosen and rejected responses are identical,
an example longer than `max_length` (refused, or cut to it when `truncate` is set).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl.core.data.errors import DataError
from rl.core.data.readers import RawRow, read_rows
from rl.core.data.records import CHAT_ROLES, unknown_role_message


@dataclass(frozen=True)
class SupervisedDataSpec:
    """Which columns hold what, and the length rule (`sft.*` / `dpo.*` keys)."""

    messages_key: str = "messages"
    prompt_key: str = "prompt"
    response_key: str = "response"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    max_length: int = 2048
    truncate: bool = False
    section: str = "sft"  # the config block named in error messages


def _messages(value: Any, where: str, key: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list | tuple) or not value:
        raise DataError(f"{where}: '{key}' must be text or a non-empty list of {{role, content}} messages, got "
                        f"{type(value).__name__}")
    out = []
    for turn, message in enumerate(value):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise DataError(f"{where}: '{key}' message {turn} must be a mapping with 'role' and 'content'")
        role, content = message["role"], message["content"]
        if role not in CHAT_ROLES:
            raise DataError(unknown_role_message(where, f"'{key}' message {turn}", role))
        if not isinstance(content, str):
            raise DataError(f"{where}: '{key}' message {turn} content must be text, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _render(tokenizer, messages: list[dict], generation_prompt: bool = False) -> list[int]:
    return _ids(tokenizer, tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt,
                                                         tokenize=False))


def check_turns(messages: list[dict], where: str) -> None:
    """A conversation to learn from: an assistant turn, and a prompt before the first."""
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: the conversation has no assistant turn, so nothing to learn from; add one or drop "
                        "the row")
    if messages[0]["role"] == "assistant":
        raise DataError(f"{where}: the conversation starts with an assistant turn; put the prompt before it")


def encode_conversation(tokenizer, messages: list[dict], where: str) -> tuple[list[int], list[bool]]:
    """(token ids, loss mask on the assistant turns' tokens) of a conversation through the chat template."""
    check_turns(messages, where)
    ids = _render(tokenizer, messages)
    mask = [False] * len(ids)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(_render(tokenizer, messages[:turn], generation_prompt=True))
        upto = _render(tokenizer, messages[:turn + 1])
        if ids[:len(upto)] != upto or start > len(upto):
            raise DataError(f"{where}: the tokenizer's chat template does not render turn {turn} as a prefix of the "
                            "whole conversation, so the assistant tokens cannot be located; use a template whose "
                            "turns render independently")
        mask[start:len(upto)] = [True] * (len(upto) - start)
    return ids, mask


def _example(ids: list[int], mask: list[bool], spec: SupervisedDataSpec, where: str) -> dict[str, torch.Tensor]:
    if len(ids) > spec.max_length:
        if not spec.truncate:
            raise DataError(f"{where}: {len(ids)} tokens, more than {spec.section}.max_length={spec.max_length}; "
                            f"raise {spec.section}.max_length, or set {spec.section}.truncate=true to cut such rows "
                            "to it")
        ids, mask = ids[:spec.max_length], mask[:spec.max_length]
        if not any(mask):
            raise DataError(f"{where}: cut to {spec.section}.max_length={spec.max_length} tokens it keeps no "
                            f"assistant token; raise {spec.section}.max_length or drop the row")
    return {"input_ids": torch.tensor(ids, dtype=torch.long), "loss_mask": torch.tensor(mask, dtype=torch.bool)}


def sft_example(tokenizer, row: RawRow, spec: SupervisedDataSpec) -> dict[str, torch.Tensor]:
    """One row as {input_ids, loss_mask}: from `messages_key`, else `prompt_key` + `response_key`."""
    return _example(*encode_conversation(tokenizer, sft_messages(row, spec), row.where), spec, row.where)


def sft_messages(row: RawRow, spec: SupervisedDataSpec) -> list[dict[str, str]]:
    """The conversation of one row, checked (columns, roles, an assistant turn) without a tokenizer."""
    values, where = row.values, row.where
    if spec.messages_key in values and values[spec.messages_key] is not None:
        messages = _messages(values[spec.messages_key], where, spec.messages_key)
    elif spec.prompt_key in values and spec.response_key in values:
        response = values[spec.response_key]
        if not isinstance(response, str):
            raise DataError(f"{where}: '{spec.response_key}' must be text, got {type(response).__name__}")
        messages = [*_messages(values[spec.prompt_key], where, spec.prompt_key),
                    {"role": "assistant", "content": response}]
    else:
        raise DataError(f"{where}: no '{spec.messages_key}' column and no '{spec.prompt_key}'/'{spec.response_key}' "
                        f"pair; set {spec.section}.messages_key, or {spec.section}.prompt_key and "
                        f"{spec.section}.response_key, to the file's columns")
    check_turns(messages, where)
    return messages


def _response(values: dict, key: str, option: str, where: str) -> str:
    if key not in values:
        raise DataError(f"{where}: no '{key}' column; set {option} to the file's column")
    value = values[key]
    if isinstance(value, list) and value and isinstance(value[-1], dict):  # a list of messages: the last answers
        value = value[-1].get("content")
    if not isinstance(value, str) or not value:
        raise DataError(f"{where}: '{key}' must be non-empty text")
    return value


def preference_pair(tokenizer, row: RawRow, spec: SupervisedDataSpec) -> tuple[dict, dict]:
    """(chosen, rejected) examples of a row, each prompt + response with the response in the loss."""
    return tuple(_example(*encode_conversation(tokenizer, conversation, row.where), spec, row.where)
                 for conversation in preference_conversations(row, spec))


def preference_conversations(row: RawRow, spec: SupervisedDataSpec) -> tuple[list[dict], list[dict]]:
    """(prompt + chosen, prompt + rejected) of one row, checked (columns, roles, distinct responses) without a
    tokenizer."""
    values, where = row.values, row.where
    if spec.prompt_key not in values:
        raise DataError(f"{where}: no '{spec.prompt_key}' column; set {spec.section}.prompt_key to the file's column")
    prompt = _messages(values[spec.prompt_key], where, spec.prompt_key)
    chosen = _response(values, spec.chosen_key, f"{spec.section}.chosen_key", where)
    rejected = _response(values, spec.rejected_key, f"{spec.section}.rejected_key", where)
    if chosen == rejected:
        raise DataError(f"{where}: chosen and rejected responses are identical, so the pair prefers nothing; fix or "
                        "drop the row")
    return tuple([*prompt, {"role": "assistant", "content": text}] for text in (chosen, rejected))


def _rows(paths: Sequence[str | Path]) -> list[RawRow]:
    rows = [row for path in paths for row in read_rows(Path(path).expanduser())]
    if not rows:
        raise DataError(f"{', '.join(map(str, paths))}: no rows; point data.train_data (or data.val_data) at files "
                        "that hold some")
    return rows


def check_rows(paths: Sequence[str | Path], spec: SupervisedDataSpec, paired: bool) -> int:
    """How many rows the files hold, each checked as `sft_messages` (or `preference_conversations` when `paired`)
    checks it: what can be known without the tokenizer, for a check before anything starts."""
    rows = _rows(paths)
    check = preference_conversations if paired else sft_messages
    for row in rows:
        check(row, spec)
    return len(rows)


def load_sft_examples(tokenizer, paths: Sequence[str | Path], spec: SupervisedDataSpec) -> list[dict]:
    return [sft_example(tokenizer, row, spec) for row in _rows(paths)]


def load_preference_pairs(tokenizer, paths: Sequence[str | Path], spec: SupervisedDataSpec) -> list[tuple[dict, dict]]:
    return [preference_pair(tokenizer, row, spec) for row in _rows(paths)]
