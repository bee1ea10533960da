"""The embedded visual task's rows: each image drawn as its grid says (every filled cell's pixels coloured, every
empty cell white, read back from the PNG), the reference response's quadrant counts and total graded right by the
GSM8K verifier, the careless one wrong exactly when the last quadrant holds a square, the share of such rows as
asked, and train and validation never sharing an image; the processor turns a row into the tokens the embedded
chat format gives, one merged patch token per quadrant."""

import io
from collections import Counter

import numpy as np
from PIL import Image

from rl.tasks.embedded_vl.model import build_processor
from rl.tasks.embedded_vl.task import CARELESS_WRONG_SHARE, CELL, GRID, QUESTION, make_rows
from rl.tasks.gsm8k.rewards import gsm8k_reward


def cells_of(png: bytes) -> set[tuple[int, int]]:
    """The filled cells read back from the image: a cell whose centre pixel is not white."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert pixels.shape == (GRID * CELL, GRID * CELL, 3)
    return {(r, c) for r in range(GRID) for c in range(GRID)
            if tuple(pixels[r * CELL + CELL // 2, c * CELL + CELL // 2]) != (255, 255, 255)}


def test_rows_say_what_their_images_show():
    rows = make_rows(200, 7, "train")
    for row in rows:
        cells = cells_of(row["images"][0]["bytes"])
        quadrants = [sum(1 for r, c in cells if (r // 2, c // 2) == q) for q in ((0, 0), (0, 1), (1, 0), (1, 1))]
        assert row["answer"] == str(len(cells)) and 1 <= len(cells) <= 9
        assert row["reference_response"] == f"{'+'.join(map(str, quadrants))}={len(cells)} #### {len(cells)}"
        assert gsm8k_reward(row["reference_response"], row["answer"]) == 1.0
        careless_right = gsm8k_reward(row["careless_response"], row["answer"]) == 1.0
        assert careless_right == (quadrants[3] == 0)
    wrong = sum(gsm8k_reward(row["careless_response"], row["answer"]) == 0.0 for row in rows)
    assert wrong == round(CARELESS_WRONG_SHARE * len(rows))
    assert len(Counter(row["answer"] for row in rows)) == 9  # every count 1..9 occurs


def test_splits_never_share_an_image_and_rows_are_distinct():
    train, validation = make_rows(300, 1, "train"), make_rows(40, 1, "validation")
    keys = [row["images"][0]["bytes"] for row in train]
    assert len(set(keys)) == len(keys)
    assert not set(keys) & {row["images"][0]["bytes"] for row in validation}
    assert make_rows(300, 1, "train") == train  # the seed decides the rows


def test_the_processor_gives_one_token_per_quadrant():
    processor = build_processor()
    row = make_rows(1, 0, "train")[0]
    text = processor.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    image = Image.open(io.BytesIO(row["images"][0]["bytes"]))
    out = processor(text=[text], images=[image], return_tensors="pt")
    tokens = processor.tokenizer.convert_ids_to_tokens(out["input_ids"][0].tolist())
    assert tokens == ["<|bos|>", "<|user|>", "<|vision_start|>", *["<|image_pad|>"] * 4, "<|vision_end|>",
                      *processor.tokenizer.tokenize(QUESTION), "<|end|>", "<|assistant|>"]
    assert out["image_grid_thw"].tolist() == [[1, 4, 4]]  # 4 x 4 patches of 14 pixels, merged 2 x 2
