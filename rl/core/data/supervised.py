"""Supervised (SFT) and preference (DPO) examples: rows read from parquet/jsonl files, checked and tokenized once.

SFT rows are chat conversations (a list of {role, content} messages under `messages_key`, SkyRL's key) or a
prompt and a response (`prompt_key`: text or a list of messages, `response_key`: text). The chat template is
applied once per row; the loss mask covers the tokens of every assistant turn (its content and the end-of-turn
token the template writes), found by rendering the conversation up to each turn. Preference rows hold a prompt and
two responses (`chosen_key`, `rejected_key`); each becomes prompt + response with the response in the loss.

SFT rows may hold images for a vision-language model: an `images` column (`rl.core.data.images`: bytes, paths or
`{bytes, path}` mappings) and, in the messages, an image content part or `<image>` per image. They are encoded with
the model's processor (each image's placeholder repeated once per merged patch) and the example carries the
images' pixel values and patch grids (`ImageInputs`).

Every problem is a `DataError` naming the file and row and the key that fixes it, raised before training starts: a
conversation without an assistant turn, an unknown role, a pair whose chosen and rejected responses are identical,
an example longer than `max_length` (refused, or cut to it when `truncate` is set; never a row with images, whose
tokens a cut could split from their pixels), images for a text model, image marks that do not match the images.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl.core.data.errors import DataError
from rl.core.data.images import (
    IMAGE_COLUMNS,
    IMAGE_PLACEHOLDER,
    content_text,
    image_parts,
    placeholder_count,
    row_images,
)
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
        if isinstance(content, list | tuple):  # content parts: text, and `<image>` where an image goes
            content = content_text(list(content), f"{where}: '{key}'", turn)
        if not isinstance(content, str):
            raise DataError(f"{where}: '{key}' message {turn} content must be text, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class _Renderer:
    """Token ids of (a prefix of) one conversation: through the tokenizer's chat template, or with images through
    the processor (the images whose marks the prefix holds)."""

    def __init__(self, encoder, images: Sequence[bytes] = ()):
        self.encoder, self.tokenizer = encoder, getattr(encoder, "tokenizer", encoder)
        self.images = [_decoded(data) for data in images]
        self.inputs = None  # the whole conversation's ImageInputs, once rendered

    def __call__(self, messages: list[dict], generation_prompt: bool = False) -> list[int]:
        count = placeholder_count([m["content"] for m in messages]) if self.images else 0
        chat = image_parts(messages) if self.images else messages
        text = self.tokenizer.apply_chat_template(chat, add_generation_prompt=generation_prompt, tokenize=False)
        if not count:
            return _ids(self.tokenizer, text)
        from rl.core.images import ImageInputs

        out = self.encoder(text=[text], images=self.images[:count], return_tensors="pt")
        if count == len(self.images):
            self.inputs = ImageInputs(out["pixel_values"], out["image_grid_thw"])
        return out["input_ids"][0].tolist()


def _decoded(data: bytes):
    import io

    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def _render(tokenizer, messages: list[dict], generation_prompt: bool = False) -> list[int]:
    return _Renderer(tokenizer)(messages, generation_prompt)


def check_turns(messages: list[dict], where: str) -> None:
    """A conversation to learn from: an assistant turn, and a prompt before the first."""
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: the conversation has no assistant turn, so nothing to learn from; add one or drop "
                        "the row")
    if messages[0]["role"] == "assistant":
        raise DataError(f"{where}: the conversation starts with an assistant turn; put the prompt before it")


def encode_conversation(tokenizer, messages: list[dict], where: str, render=None) -> tuple[list[int], list[bool]]:
    """(token ids, loss mask on the assistant turns' tokens) of a conversation through the chat template (or
    `render`, a `_Renderer` with the conversation's images)."""
    check_turns(messages, where)
    render = render or _Renderer(tokenizer)
    ids = render(messages)
    mask = [False] * len(ids)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(render(messages[:turn], generation_prompt=True))
        upto = render(messages[:turn + 1])
        if ids[:len(upto)] != upto or start > len(upto):
            raise DataError(f"{where}: the tokenizer's chat template does not render turn {turn} as a prefix of the "
                            "whole conversation, so the assistant tokens cannot be located; use a template whose "
                            "turns render independently")
        mask[start:len(upto)] = [True] * (len(upto) - start)
    return ids, mask


def _example(ids: list[int], mask: list[bool], spec: SupervisedDataSpec, where: str, images=None
             ) -> dict[str, torch.Tensor]:
    if len(ids) > spec.max_length:
        if images is not None:
            raise DataError(f"{where}: {len(ids)} tokens with its images, more than {spec.section}.max_length="
                            f"{spec.max_length}, and a row with images is never cut (a cut could split an image's "
                            f"tokens from its pixels); raise {spec.section}.max_length or drop the row")
        if not spec.truncate:
            raise DataError(f"{where}: {len(ids)} tokens, more than {spec.section}.max_length={spec.max_length}; "
                            f"raise {spec.section}.max_length, or set {spec.section}.truncate=true to cut such rows "
                            "to it")
        ids, mask = ids[:spec.max_length], mask[:spec.max_length]
        if not any(mask):
            raise DataError(f"{where}: cut to {spec.section}.max_length={spec.max_length} tokens it keeps no "
                            f"assistant token; raise {spec.section}.max_length or drop the row")
    example = {"input_ids": torch.tensor(ids, dtype=torch.long), "loss_mask": torch.tensor(mask, dtype=torch.bool)}
    return {**example, "images": images} if images is not None else example


def sft_example(encoder, row: RawRow, spec: SupervisedDataSpec, directory: Path = Path(".")
                ) -> dict[str, torch.Tensor]:
    """One row as {input_ids, loss_mask} (and `images` where it has some): from `messages_key`, else `prompt_key` +
    `response_key`. `encoder`: the tokenizer, or a vision-language model's processor."""
    messages = sft_messages(row, spec)
    images = sft_images(row, messages, directory)
    if images and not hasattr(encoder, "image_processor"):
        raise DataError(f"{row.where}: has {len(images)} image(s), but the model is a text model (no image "
                        "processor); point trainer.policy.model.path at a vision-language model (Qwen2-VL, "
                        "Qwen2.5-VL), or drop the image column")
    render = _Renderer(encoder, images)
    ids, mask = encode_conversation(encoder, messages, row.where, render)
    return _example(ids, mask, spec, row.where, render.inputs)


def sft_images(row: RawRow, messages: list[dict], directory: Path) -> tuple[bytes, ...]:
    """The row's images (each checked), as many as its conversation's (`sft_messages`) image marks."""
    images = row_images(row.values, row.where, directory)
    marks = placeholder_count([m["content"] for m in messages])
    if marks != len(images):
        raise DataError(f"{row.where}: the conversation marks {marks} image(s) ({{\"type\": \"image\"}} parts or "
                        f"{IMAGE_PLACEHOLDER}) but the row has {len(images)}; give one mark per image, in order")
    return images


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
    if any(values.get(column) is not None for column in IMAGE_COLUMNS):
        raise DataError(f"{where}: the row has images, and preference pairs are text only so far; drop the image "
                        "column")
    if spec.prompt_key not in values:
        raise DataError(f"{where}: no '{spec.prompt_key}' column; set {spec.section}.prompt_key to the file's column")
    prompt = _messages(values[spec.prompt_key], where, spec.prompt_key)
    chosen = _response(values, spec.chosen_key, f"{spec.section}.chosen_key", where)
    rejected = _response(values, spec.rejected_key, f"{spec.section}.rejected_key", where)
    if chosen == rejected:
        raise DataError(f"{where}: chosen and rejected responses are identical, so the pair prefers nothing; fix or "
                        "drop the row")
    return tuple([*prompt, {"role": "assistant", "content": text}] for text in (chosen, rejected))


def _rows(paths: Sequence[str | Path]) -> list[tuple[RawRow, Path]]:
    """Every row of the files, with the directory its relative image paths start from."""
    files = [Path(path).expanduser() for path in paths]
    rows = [(row, path.parent) for path in files for row in read_rows(path)]
    if not rows:
        raise DataError(f"{', '.join(map(str, paths))}: no rows; point data.train_data (or data.val_data) at files "
                        "that hold some")
    return rows


def check_rows(paths: Sequence[str | Path], spec: SupervisedDataSpec, paired: bool) -> int:
    """How many rows the files hold, each checked as `sft_messages` and `sft_images` (or `preference_conversations`
    when `paired`) check it: what can be known without the tokenizer, for a check before anything starts."""
    rows = _rows(paths)
    responses = 0  # assistant turns with words in them
    for row, directory in rows:
        if paired:
            conversations = preference_conversations(row, spec)
        else:
            conversations = (sft_messages(row, spec),)
            sft_images(row, conversations[0], directory)
        responses += sum(bool(m["content"].strip()) for c in conversations for m in c if m["role"] == "assistant")
    if not responses:
        raise DataError(f"{', '.join(map(str, paths))}: every assistant turn of its {len(rows)} rows is empty, so "
                        "training would teach only to end the turn at once; fill in the responses (or point at the "
                        "columns that hold them: the sft/dpo block's keys)")
    return len(rows)


def load_sft_examples(encoder, paths: Sequence[str | Path], spec: SupervisedDataSpec) -> list[dict]:
    return [sft_example(encoder, row, spec, directory) for row, directory in _rows(paths)]


def load_preference_pairs(tokenizer, paths: Sequence[str | Path], spec: SupervisedDataSpec) -> list[tuple[dict, dict]]:
    return [preference_pair(tokenizer, row, spec) for row, _ in _rows(paths)]
