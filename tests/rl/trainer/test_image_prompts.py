"""Prompts with images encoded for a vision-language model's engine: the ids and pixel values the processor gives
for the chat written out by hand in the embedded format (one image part per `<image>` mark), for the embedded
visual task's rows as loaded from parquet; a prompt without images encodes as the text path does; a plain-text
prompt with images is refused."""

import io

import pytest
import torch
from PIL import Image

from rl.core.data import load_prompt_dataset
from rl.core.data.parquet_io import write_parquet_atomic
from rl.tasks.embedded_vl.model import build_processor
from rl.tasks.embedded_vl.task import make_rows
from rl.trainer.rollout.image_prompts import encode_with_images
from rl.trainer.rollout.prompt_encoding import render_ids


@pytest.fixture(scope="module")
def processor():
    return build_processor()


def test_a_row_with_an_image_encodes_as_the_processor_does(processor, tmp_path):
    rows = make_rows(3, 0, "train")
    write_parquet_atomic(rows, tmp_path / "squares.parquet")
    for row, record in zip(rows, load_prompt_dataset([tmp_path / "squares.parquet"]), strict=True):
        ids, images = encode_with_images(processor, record)
        text = "<|bos|><|user|><|vision_start|><|image_pad|><|vision_end|>How many squares?<|end|><|assistant|>"
        want = processor(text=[text], images=[Image.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB")],
                         return_tensors="pt")
        assert ids == want["input_ids"][0].tolist() and ids.count(processor.tokenizer.convert_tokens_to_ids(
            "<|image_pad|>")) == 4
        assert torch.equal(images.pixel_values, want["pixel_values"])
        assert images.grid_thw.tolist() == [[1, 4, 4]]


def test_a_prompt_without_images_encodes_as_text(processor, tmp_path):
    write_parquet_atomic([{"prompt": [{"role": "user", "content": "What is 1 + 2?"}], "answer": "3"}],
                         tmp_path / "a.parquet")
    record = load_prompt_dataset([tmp_path / "a.parquet"])[0]
    assert encode_with_images(processor, record) == (render_ids(processor.tokenizer, record), None)


def test_a_plain_text_prompt_with_images_is_refused(processor, tmp_path):
    png = make_rows(1, 0, "train")[0]["images"][0]["bytes"]
    write_parquet_atomic([{"prompt": "<image> How many squares?", "answer": "3", "images": [png]}],
                         tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"a\.parquet row 0: a prompt with images must be a chat"):
        encode_with_images(processor, load_prompt_dataset([tmp_path / "a.parquet"])[0])
