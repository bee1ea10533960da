"""Typed prompt records and the dataset that holds them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rl.core.data.errors import DataError


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a chat prompt."""

    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


Prompt = str | tuple[ChatMessage, ...]

CHAT_ROLES = ("system", "user", "assistant", "tool")
"""The roles a chat message may have: the ones both Qwen2.5's and Llama 3's chat templates render. Qwen2.5's
template silently drops a message of any other role (OpenAI's `developer` and `function` included: write them as
`system` and `tool`), and Llama 3's writes it as a header the model never saw in training."""


@dataclass(frozen=True)
class PromptRecord:
    """One training prompt.

    `prompt` is plain text or a tuple of chat messages; `answer` is the reference the reward function checks against;
    `data_source` names the dataset (it can pick the reward function); `index` is the row's id within its source.
    `fields` holds the row's other columns (a user's reward function can ask for them by name); `where` locates the
    row for messages ("train.parquet row 7"). `env_class` is the environment the row's own `env_class` column
    names (None without one): it plays the row's episodes in place of environment.env_class, as in SkyRL.
    `images` are the row's encoded images, one per `<image>` in the prompt's text, in order
    (`rl.core.data.images`).
    """

    prompt: Prompt
    answer: str
    data_source: str
    index: int
    fields: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    where: str = field(default="", compare=False, hash=False)
    env_class: str | None = None
    images: tuple[bytes, ...] = field(default=(), compare=False, hash=False, repr=False)

    @property
    def is_chat(self) -> bool:
        return not isinstance(self.prompt, str)

    def messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages; a plain-text prompt becomes a single user turn."""
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [message.as_dict() for message in self.prompt]


def describe_row(record: PromptRecord) -> str:
    """Where a record came from, for a message: its file and row, else its index in its data source."""
    return record.where or f"row index {record.index} of {record.data_source}"


def parse_prompt(value: object, where: str) -> Prompt:
    """Check a raw prompt cell: a non-empty string, or a non-empty list of {"role", "content"} string mappings."""
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: the prompt is an empty string; every row needs prompt text")
        return value
    if isinstance(value, list | tuple) and value:
        return tuple(_parse_message(message, where, turn) for turn, message in enumerate(value))
    raise DataError(
        f"{where}: the prompt must be text or a non-empty list of chat messages "
        f'[{{"role": ..., "content": ...}}], got {type(value).__name__} {value!r:.80}'
    )


def _parse_message(message: object, where: str, turn: int) -> ChatMessage:
    if isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
        if isinstance(content, list | tuple) and content:
            from rl.core.data.images import content_text

            content = content_text(list(content), where, turn)
        if isinstance(role, str) and isinstance(content, str):
            if role not in CHAT_ROLES:
                raise DataError(unknown_role_message(where, f"chat message {turn}", role))
            if not content.strip():
                raise DataError(f"{where}: chat message {turn} ({role}) has empty content; every message needs text")
            return ChatMessage(role=role, content=content)
    raise DataError(
        f'{where}: chat message {turn} must be a mapping with string "role" and "content", got {message!r:.80}'
    )


def unknown_role_message(where: str, message: str, role: str) -> str:
    return (f"{where}: {message} has unknown role {role!r}; the roles are {', '.join(CHAT_ROLES)} (chat templates "
            "drop or misrender any other): rename it to one of them")


class PromptDataset:
    """An immutable, non-empty sequence of `PromptRecord`s read from one or more files."""

    def __init__(self, records: list[PromptRecord] | tuple[PromptRecord, ...], files: tuple[str, ...] = ()):
        if not records:
            named = ", ".join(files) or "(no files)"
            raise DataError(f"the prompt dataset from {named} has no rows; pass files that hold at least one prompt")
        self.records: tuple[PromptRecord, ...] = tuple(records)
        self.files = files

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, position: int) -> PromptRecord:
        return self.records[position]

    def __iter__(self) -> Iterator[PromptRecord]:
        return iter(self.records)

    def __repr__(self) -> str:
        return f"PromptDataset({len(self)} prompts from {', '.join(self.files) or 'memory'})"
