"""Prompt rows with images: every form of veRL's / SkyRL's / Hugging Face datasets' image column loads to the same
encoded bytes, content parts and `<image>` marks become one text with a mark per image, and the embedded visual
task's parquet file reads back with its images (the bad forms: the bad-input catalogue)."""

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from rl.core.data import load_prompt_dataset
from rl.core.data.parquet_io import write_parquet_atomic


def png(colour: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (28, 42), (colour, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def test_bytes_mappings_and_paths_load_as_the_same_images(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "b.png").write_bytes(png(2))
    chat = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"},
                                                     {"type": "image"}, {"type": "text", "text": "?"}]}],
             "answer": "1", "images": [{"bytes": png(1), "path": None}, {"bytes": None, "path": "pics/b.png"}]}]
    text = [{"prompt": "<image> what?", "answer": "2", "images": [png(3)], "extra": 5},
            {"prompt": "no image", "answer": "3", "images": [], "extra": 6}]
    write_parquet_atomic(chat, tmp_path / "chat.parquet")  # one column cannot mix chats and text
    write_parquet_atomic(text, tmp_path / "text.parquet")
    records = load_prompt_dataset([tmp_path / "chat.parquet", tmp_path / "text.parquet"])
    assert records[0].images == (png(1), png(2))
    assert records[0].messages() == [{"role": "user", "content": "<image>and<image>?"}]
    assert records[1].images == (png(3),) and records[1].prompt == "<image> what?"
    assert records[1].fields == {"extra": 5}  # the image column is not a field the reward sees
    assert records[2].images == ()


def test_a_jsonl_row_names_its_images_by_path(tmp_path):
    (tmp_path / "a.png").write_bytes(png(9))
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "<image>", "answer": "1", "image": "a.png"}) + "\n")
    assert load_prompt_dataset([tmp_path / "train.jsonl"])[0].images == (png(9),)


def test_the_embedded_visual_task_reads_back_with_its_images(tmp_path):
    from rl.tasks.embedded_vl.task import make_rows

    rows = make_rows(16, 0, "train")
    write_parquet_atomic(rows, tmp_path / "squares.parquet")
    assert pq.read_schema(tmp_path / "squares.parquet").field("images").type == pa.list_(
        pa.struct([("bytes", pa.binary())]))
    records = load_prompt_dataset([tmp_path / "squares.parquet"])
    assert [r.images for r in records] == [(row["images"][0]["bytes"],) for row in rows]
    assert all(r.messages()[0]["content"] == "<image>How many squares?" for r in records)
