"""A stand-in for the embedded job's warm-up where the checkpoint's bookkeeping (markers, reuse, rebuilds, the cache)
is under test and the warm-up's SFT run is not (tests/rl/tasks/embedded/test_embedded_warmup.py runs that): the
recipe's untrained model saved as the run's export, its initialisation seeded by the whole recipe, so that recipes
that differ give different weights and equal recipes equal ones."""

from __future__ import annotations

import zlib
from dataclasses import asdict
from pathlib import Path

from rl.tasks.embedded.model import build_model, save_pretrained_model, tiny_model_config
from rl.tasks.embedded.tokenizer import build_tokenizer


class UntrainedWarmup:
    """`prepare.warm_up_model`'s signature; `recipes` records the recipe of each call."""

    def __init__(self):
        self.recipes: list = []

    def __call__(self, work: Path, recipe, log) -> tuple[dict[str, float], Path]:
        self.recipes.append(recipe)
        tokenizer = build_tokenizer()
        seed = zlib.crc32(repr(sorted(asdict(recipe).items())).encode())
        export = save_pretrained_model(build_model(tiny_model_config(tokenizer, recipe.model_size), seed), tokenizer,
                                       work / "export")
        return {"warmup_loss_first": 0.0, "warmup_loss_last": 0.0, "warmup_seconds": 0.0, "val_accuracy": 0.0}, export
