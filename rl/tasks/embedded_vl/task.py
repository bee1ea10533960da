"""The embedded visual task: count the filled squares of a 4 x 4 grid, answered in GSM8K's `#### N` format.

An image is 56 x 56 pixels, a grid of 14-pixel cells (one vision patch each), some of them filled with a colour on
white. The reference response counts the four 2 x 2 quadrants (each one merged token of Qwen2-VL's vision tower),
top left, top right, bottom left, bottom right, and adds them: `2+1+0+3=6 #### 6`. Its careless response skips
the last quadrant (`2+1+0=3 #### 3`) and is wrong whenever that quadrant holds a square. Problems are drawn so
that a fixed share (`CARELESS_WRONG_SHARE`) has squares in the last quadrant.

The split of a problem is a fixed function of its grid (a hash), so train and validation never share an image.
"""

from __future__ import annotations

import hashlib
import io
import random
from dataclasses import dataclass

from rl.tasks.embedded.tokenizer import ANSWER_MARKER

DATA_SOURCE = "synthetic/squares"
QUESTION = "How many squares?"
GRID, CELL = 4, 14
VALIDATION_SHARE = 8
CARELESS_WRONG_SHARE = 0.75
COLOURS = ((220, 40, 40), (40, 160, 60), (40, 80, 220), (230, 160, 20))


@dataclass(frozen=True)
class Grid:
    filled: frozenset[tuple[int, int]]  # (row, column) of each filled cell
    colour: int  # index into COLOURS

    def quadrant_counts(self) -> list[int]:
        half = GRID // 2
        return [sum(1 for r, c in self.filled if (r // half, c // half) == (qr, qc)) for qr in (0, 1) for qc in (0, 1)]

    @property
    def answer(self) -> int:
        return len(self.filled)

    def response(self, careless: bool) -> str:
        counts = self.quadrant_counts()[: 3 if careless else 4]
        return f"{'+'.join(map(str, counts))}={sum(counts)} {ANSWER_MARKER} {sum(counts)}"

    def png(self) -> bytes:
        from PIL import Image, ImageDraw

        image = Image.new("RGB", (GRID * CELL, GRID * CELL), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        for r, c in sorted(self.filled):
            box = (c * CELL + 2, r * CELL + 2, c * CELL + CELL - 3, r * CELL + CELL - 3)
            draw.rectangle(box, fill=COLOURS[self.colour])
        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()

    @property
    def key(self) -> str:
        return "".join("1" if (r, c) in self.filled else "0" for r in range(GRID) for c in range(GRID))


def split_of(grid: Grid) -> str:
    digest = hashlib.sha256(grid.key.encode()).digest()
    return "validation" if int.from_bytes(digest[:8], "big") % VALIDATION_SHARE == 0 else "train"


def draw_grid(rng: random.Random, last_quadrant_filled: bool) -> Grid:
    """A grid of 1-9 filled cells, with squares in the bottom-right quadrant or without, as asked."""
    cells = [(r, c) for r in range(GRID) for c in range(GRID)]
    last = [(r, c) for r, c in cells if r >= GRID // 2 and c >= GRID // 2]
    count = rng.randint(1, 9)
    if last_quadrant_filled:
        first = rng.choice(last)
        chosen = {first, *rng.sample([cell for cell in cells if cell != first], count - 1)}
    else:
        chosen = set(rng.sample([cell for cell in cells if cell not in last], count))
    return Grid(frozenset(chosen), rng.randrange(len(COLOURS)))


def make_rows(n: int, seed: int, split: str) -> list[dict[str, object]]:
    """`n` distinct problems of `split` as prompt-file rows: prompt (a user message whose content is the image and
    the question), images (one PNG), answer, reference_response, careless_response, data_source, index."""
    rng = random.Random(f"{DATA_SOURCE}/{seed}/{split}")
    wrong = round(CARELESS_WRONG_SHARE * n)
    seen, grids = set(), []
    while len(grids) < n:
        grid = draw_grid(rng, last_quadrant_filled=len(grids) < wrong)
        if split_of(grid) == split and grid.key not in seen:
            seen.add(grid.key)
            grids.append(grid)
    rng.shuffle(grids)
    return [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
             "images": [{"bytes": grid.png()}], "answer": str(grid.answer), "data_source": DATA_SOURCE,
             "index": index, "reference_response": grid.response(careless=False),
             "careless_response": grid.response(careless=True)} for index, grid in enumerate(grids)]
