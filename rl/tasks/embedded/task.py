"""The embedded default's synthetic task: two-number additions answered in GSM8K's `#### N` format.

A problem `What is 38 + 47?` has the reference response `8+7=15 3+4+1=8 #### 85`: column addition, ones then tens
with the carry, then the answer after `####`, graded by the strict GSM8K verifier. Its careless response forgets
the carry (`8+7=15 3+4=7 #### 75`) and is wrong whenever the ones column carries; without a carry the two agree.
Problems are drawn so that a fixed share of them (`TaskSpec.carry_share`) carries.

The split of a problem is a fixed function of its text (a hash), independent of the seed, so the train and
validation splits never share a prompt whatever seeds or sizes are asked for.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from rl.core.data.parquet_io import write_parquet_atomic
from rl.tasks.embedded.tokenizer import ANSWER_MARKER

DATA_SOURCE = "synthetic/arith"
SPLIT_FILES = {"train": "train.parquet", "validation": "validation.parquet"}
VALIDATION_SHARE = 8  # one problem in VALIDATION_SHARE belongs to the validation split


@dataclass(frozen=True)
class Problem:
    left: int
    right: int

    @property
    def question(self) -> str:
        return f"What is {self.left} + {self.right}?"

    @property
    def answer(self) -> int:
        return self.left + self.right

    @property
    def carries(self) -> bool:
        """Whether the ones column carries into the tens."""
        return self.left % 10 + self.right % 10 >= 10

    @property
    def reference_response(self) -> str:
        return self.column_addition(with_carry=True)

    @property
    def careless_response(self) -> str:
        return self.column_addition(with_carry=False)

    def column_addition(self, with_carry: bool) -> str:
        """Ones column, then tens column (plus the carry when `with_carry`), then the answer those columns give."""
        (left_tens, left_ones), (right_tens, right_ones) = divmod(self.left, 10), divmod(self.right, 10)
        ones = left_ones + right_ones
        carry = ones // 10 if with_carry else 0
        tens_terms = f"{left_tens}+{right_tens}" + (f"+{carry}" if carry else "")
        tens = left_tens + right_tens + carry
        return f"{left_ones}+{right_ones}={ones} {tens_terms}={tens} {ANSWER_MARKER} {tens * 10 + ones % 10}"


@dataclass(frozen=True)
class TaskSpec:
    """Which problems exist and how they are drawn: both operands in [min_operand, max_operand] (at most two
    digits), and a `carry_share` of each split's rows carrying in the ones column (None: drawn uniformly)."""

    min_operand: int = 10
    max_operand: int = 99
    carry_share: float | None = 0.75

    def __post_init__(self) -> None:
        if not 0 <= self.min_operand <= self.max_operand <= 99:
            raise ValueError(
                f"TaskSpec needs 0 <= min_operand <= max_operand <= 99 (the worked answer adds two columns), "
                f"got min_operand={self.min_operand}, max_operand={self.max_operand}"
            )
        if self.carry_share is not None and not 0.0 <= self.carry_share <= 1.0:
            raise ValueError(f"TaskSpec.carry_share must be None or lie in [0, 1], got {self.carry_share}")

    def problems(self) -> list[Problem]:
        operands = range(self.min_operand, self.max_operand + 1)
        return [Problem(left, right) for left in operands for right in operands]


def split_of(problem: Problem) -> str:
    """The split a problem belongs to, from a hash of its question text (stable across runs and machines)."""
    digest = hashlib.sha256(problem.question.encode("utf-8")).digest()
    return "validation" if int.from_bytes(digest[:8], "big") % VALIDATION_SHARE == 0 else "train"


def make_task_rows(n: int, seed: int, split: str, spec: TaskSpec | None = None) -> list[dict[str, object]]:
    """`n` distinct problems of `split` ("train" or "validation"), drawn with `seed`, as prompt-file rows.

    Keys: prompt (one user chat message), answer (str), data_source, index (0..n-1), reference_response,
    careless_response, carries (bool).
    """
    if split not in SPLIT_FILES:
        raise ValueError(f"split must be one of {', '.join(SPLIT_FILES)}, got {split!r}")
    spec = spec or TaskSpec()
    pool = [problem for problem in spec.problems() if split_of(problem) == split]
    rng = random.Random(f"{DATA_SOURCE}/{seed}/{split}")
    chosen = draw(pool, n, spec.carry_share, rng, f"split {split!r}")
    return [
        {
            "prompt": [{"role": "user", "content": problem.question}],
            "answer": str(problem.answer),
            "data_source": DATA_SOURCE,
            "index": index,
            "reference_response": problem.reference_response,
            "careless_response": problem.careless_response,
            "carries": problem.carries,
        }
        for index, problem in enumerate(chosen)
    ]


def draw(pool: list[Problem], n: int, carry_share: float | None, rng: random.Random, where: str) -> list[Problem]:
    """`n` distinct problems of `pool` in random order, round(carry_share * n) of them carrying (if not None)."""
    if carry_share is None:
        groups = {"any": (pool, n)}
    else:
        with_carry = round(carry_share * n)
        groups = {
            "carrying": ([p for p in pool if p.carries], with_carry),
            "not carrying": ([p for p in pool if not p.carries], n - with_carry),
        }
    if n < 1 or any(wanted > len(group) for group, wanted in groups.values()):
        needs = ", ".join(f"{wanted} {kind} of {len(group)}" for kind, (group, wanted) in groups.items())
        raise ValueError(f"n={n} rows asked of {where}, which needs {needs} problems; pick a smaller n")
    chosen = [problem for group, wanted in groups.values() for problem in rng.sample(group, wanted)]
    rng.shuffle(chosen)
    return chosen


def write_task_dataset(
    output_dir: str | Path, n_train: int, n_val: int, seed: int, spec: TaskSpec | None = None
) -> tuple[Path, Path]:
    """Write train.parquet and validation.parquet (each atomically) under `output_dir`; returns their paths."""
    directory = Path(output_dir).expanduser()
    train = make_task_rows(n_train, seed, "train", spec)
    validation = make_task_rows(n_val, seed, "validation", spec)
    shared = {row["prompt"][0]["content"] for row in train} & {row["prompt"][0]["content"] for row in validation}
    if shared:
        raise AssertionError(f"train and validation share {len(shared)} prompts, e.g. {sorted(shared)[0]!r}")
    paths = (directory / SPLIT_FILES["train"], directory / SPLIT_FILES["validation"])
    for rows, path in zip((train, validation), paths, strict=True):
        write_parquet_atomic(rows, path)
    return paths
