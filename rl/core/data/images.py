"""A prompt row's images: read from its `images` column (veRL's and SkyRL's; `image` for one) and checked when the
data loads, so a bad image is named with its file and row before anything starts.

Each entry of the column is encoded image bytes, a mapping with `bytes` and/or `path` (Hugging Face datasets'
Image feature, as parquet files written by `datasets` hold them), or a path (relative to the prompt file's
directory). Every image is decoded once to check it (PIL reads it, at most `MAX_IMAGE_PIXELS` pixels) and kept
encoded. Where each image goes in the prompt is marked by a content part `{"type": "image"}` of a chat message
(OpenAI's and Hugging Face's form) or by `<image>` in the text (veRL's); the records hold the text with `<image>`
at each place, and the marks must be as many as the images.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl.core.data.errors import DataError

IMAGE_COLUMNS = ("images", "image")
IMAGE_PLACEHOLDER = "<image>"
MAX_IMAGE_PIXELS = 4096 * 4096
"""The most pixels an image may have: larger ones are refused, not resized (a processor would shrink them to its
own limit anyway, and a decompression bomb is stopped before it is decoded)."""


def row_images(values: Mapping[str, Any], where: str, directory: Path) -> tuple[bytes, ...]:
    """The encoded images of a row (none without an image column), each checked."""
    columns = [column for column in IMAGE_COLUMNS if values.get(column) is not None]
    if len(columns) > 1:
        raise DataError(f"{where}: both columns {columns[0]!r} and {columns[1]!r} hold images; keep one")
    if not columns:
        return ()
    column = columns[0]
    entries = values[column]
    if not isinstance(entries, list | tuple):
        entries = [entries]
    return tuple(_checked(_encoded(entry, f"{where}: {column}[{k}]", directory), f"{where}: {column}[{k}]")
                 for k, entry in enumerate(entries))


def _encoded(entry: Any, where: str, directory: Path) -> bytes:
    if isinstance(entry, bytes | bytearray):
        return bytes(entry)
    if isinstance(entry, Mapping):
        if entry.get("bytes") is not None:
            return _encoded(entry["bytes"], where, directory)
        if entry.get("path") is not None:
            return _encoded(entry["path"], where, directory)
        raise DataError(f"{where}: the image has neither 'bytes' nor 'path'; give the encoded image or its file")
    if isinstance(entry, str):
        path = (directory / entry).expanduser()
        try:
            return path.read_bytes()
        except OSError as error:
            raise DataError(f"{where}: cannot read the image file {path} ({error.strerror or error}); fix the path "
                            "(relative paths are taken from the prompt file's directory)") from None
    raise DataError(f"{where}: an image must be encoded bytes, a path, or a mapping with 'bytes' or 'path', got "
                    f"{type(entry).__name__}")


def _checked(data: bytes, where: str) -> bytes:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise DataError(f"{where}: the image is {width} x {height} pixels, more than {MAX_IMAGE_PIXELS} "
                                "(4096 x 4096); scale it down before training")
            image.load()
    except DataError:
        raise
    except Exception as error:  # PIL raises many kinds for a damaged or foreign file
        raise DataError(f"{where}: not a readable image ({type(error).__name__}: {error}); re-encode it as PNG or "
                        "JPEG") from None
    return data


def content_text(parts: list, where: str, turn: int) -> str:
    """A chat message's content given as parts: the text parts joined, `<image>` where an image part is."""
    pieces = []
    for k, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind in ("image", "image_url"):
            pieces.append(IMAGE_PLACEHOLDER)
        else:
            raise DataError(f'{where}: chat message {turn} content part {k} must be {{"type": "text", "text": ...}} '
                            f'or {{"type": "image"}}, got {part!r:.80}')
    return "".join(pieces)


def placeholder_count(texts: list[str]) -> int:
    return sum(text.count(IMAGE_PLACEHOLDER) for text in texts)


def image_parts(messages: list[dict]) -> list[dict]:
    """Messages whose text holds `<image>` marks with each content as parts (text, and an image part at each
    mark), as a vision-language model's chat template places images."""
    out = []
    for message in messages:
        parts = []
        for k, text in enumerate(message["content"].split(IMAGE_PLACEHOLDER)):
            if k:
                parts.append({"type": "image"})
            if text:
                parts.append({"type": "text", "text": text})
        out.append({"role": message["role"], "content": parts})
    return out
