"""Where a row's prompt and answer are, for the row layouts other projects write.

- Ours: the prompt in `prompt_key`, the answer in `answer_key`.
- SkyRL's (its data preparation scripts): no answer column; the answer is `reward_spec.ground_truth`.
- NeMo RL's math data (`messages`, as its ResponseDataset stores rows and its math processor reads them): no prompt
  column; a conversation whose last message is the assistant's answer, the messages before it the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl.core.data.errors import DataError
from rl.core.data.readers import RawRow

MESSAGES = "messages"


def prompt_and_answer(row: RawRow, prompt_key: str, answer_key: str) -> tuple[Any, Any, str]:
    """(the raw prompt, the raw answer, where the answer was read, for messages)."""
    values = row.values
    messages = values.get(MESSAGES)
    if prompt_key not in values and answer_key not in values and _ends_with_answer(messages):
        answer = messages[-1].get("content")
        return list(messages[:-1]), answer, f"{MESSAGES}[-1].content"
    prompt = required(row, prompt_key, "prompt_key")
    spec = values.get("reward_spec")
    if answer_key not in values and isinstance(spec, Mapping) and "ground_truth" in spec:
        if spec["ground_truth"] is None:
            raise DataError(f"{row.where}: reward_spec.ground_truth is null; every row needs a reference answer")
        return prompt, spec["ground_truth"], "reward_spec.ground_truth"
    if answer_key not in values:
        found = ", ".join(sorted(values)) or "(none)"
        raise DataError(
            f"{row.where}: no column '{answer_key}' and no reward_spec.ground_truth, so no answer (columns found: "
            f"{found}); add one to the file or pass answer_key= naming the column that holds it"
        )
    return prompt, required(row, answer_key, "answer_key"), answer_key


def _ends_with_answer(messages: Any) -> bool:
    """A conversation of at least a prompt message and the assistant's answer after it."""
    return (isinstance(messages, list | tuple) and len(messages) >= 2 and isinstance(messages[-1], Mapping)
            and messages[-1].get("role") == "assistant")


def required(row: RawRow, key: str, option: str) -> object:
    if key not in row.values:
        found = ", ".join(sorted(row.values)) or "(none)"
        raise DataError(
            f"{row.where}: no column '{key}' (columns found: {found}); "
            f"add it to the file or pass {option}= naming the column that holds it"
        )
    value = row.values[key]
    if value is None:
        raise DataError(f"{row.where}: column '{key}' is null; every row needs a value")
    return value
