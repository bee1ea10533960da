"""The embedded job's supervised and preference data, for `rl.launch.sft` and `rl.launch.dpo`.

- SFT (`write_sft_job`): the untrained small model (chance level) and the warm-up's demonstrations — the reference
  response, or for a seeded `forget_rate` share of the carrying problems the careless one — as prompt/response
  rows; the warm-up (`prepare.warm_up_model`) is this run on one worker for `WARMUP_STEPS` steps.
- DPO (`write_preference_set`): pairs of a correct (carry kept) and a careless (carry forgotten) answer to the same
  problem; only carrying problems, where the two differ.
"""

from __future__ import annotations

from pathlib import Path

from rl.core.data.parquet_io import write_parquet_atomic
from rl.tasks.embedded.prepare import DEFAULT_SEED, Recipe, write_untrained_job
from rl.tasks.embedded.task import make_task_rows
from rl.tasks.embedded.warmup import careless_demonstrations


def write_sft_job(workdir: str | Path, seed: int = DEFAULT_SEED, recipe: Recipe | None = None):
    """The untrained model and the task data, the train rows' `reference_response` as the warm-up demonstrates it
    (careless on `recipe.forget_rate` of the carrying rows). Returns an `EmbeddedDefault`."""
    recipe = recipe or Recipe(seed=seed)
    job = write_untrained_job(workdir, seed, n_train=recipe.n_train, n_val=recipe.n_val, model_size=recipe.model_size)
    rows = careless_demonstrations(make_task_rows(recipe.n_train, seed, "train"), recipe.forget_rate, seed)
    write_parquet_atomic(rows, Path(job.train_data))
    return job


def preference_rows(n: int, seed: int, split: str) -> list[dict]:
    """`n` carrying problems of `split` as (prompt, chosen, rejected, answer) rows."""
    rows = [row for row in make_task_rows(4 * n, seed, split) if row["carries"]][:n]
    if len(rows) < n:
        raise ValueError(f"only {len(rows)} carrying problems in split {split!r}; ask for fewer pairs")
    return [{"prompt": row["prompt"], "chosen": row["reference_response"], "rejected": row["careless_response"],
             "answer": row["answer"], "index": i} for i, row in enumerate(rows)]


def write_preference_set(directory: str | Path, n_train: int = 1000, n_val: int = 64, seed: int = DEFAULT_SEED
                         ) -> tuple[Path, Path]:
    """train.parquet and validation.parquet of preference pairs under `directory`."""
    root = Path(directory).expanduser()
    paths = (root / "train.parquet", root / "validation.parquet")
    for rows, path in zip((preference_rows(n_train, seed, "train"), preference_rows(n_val, seed, "validation")),
                          paths, strict=True):
        write_parquet_atomic(rows, path)
    return paths
