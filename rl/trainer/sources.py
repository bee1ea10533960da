"""Resolves where the model and the prompts come from: paths as given, or the embedded default job.

`trainer.policy.model.path=embedded` and data lists holding `embedded` select the built-in job: a small model made
locally with the project's own tokenizer, briefly warmed up on a synthetic task written in GSM8K's answer format
(once per machine: the warmed-up model is kept in a per-user cache, `rl.tasks.embedded.cache`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

EMBEDDED = "embedded"


EMBEDDED_TEACHER = "embedded_teacher"


@dataclass(frozen=True)
class Sources:
    model_path: str
    train_data: list[str]
    val_data: list[str]
    ref_path: str | None = None  # trainer.ref.model.path resolved (None: the policy's starting weights)


def uses_embedded(cfg) -> bool:
    return EMBEDDED in (cfg.trainer.policy.model.path, *cfg.data.train_data, *(cfg.data.val_data or []))


def resolve_sources(cfg, run_dir: str) -> Sources:
    model_path, train, val = cfg.trainer.policy.model.path, list(cfg.data.train_data), list(cfg.data.val_data or [])
    if uses_embedded(cfg):
        from rl.tasks.embedded.cache import default_cache_dir
        from rl.tasks.embedded.prepare import prepare_embedded_default

        job = prepare_embedded_default(os.path.join(run_dir, "embedded"), seed=cfg.trainer.seed,
                                       cache_dir=default_cache_dir())
        model_path = job.model_path if model_path == EMBEDDED else model_path
        train = [job.train_data if path == EMBEDDED else path for path in train]
        val = [job.val_data if path == EMBEDDED else path for path in val]
    return Sources(model_path=str(model_path), train_data=[str(p) for p in train], val_data=[str(p) for p in val],
                   ref_path=_reference_path(cfg, run_dir))


def _reference_path(cfg, run_dir: str) -> str | None:
    """trainer.ref.model.path, with `embedded_teacher` built (once per machine, in the embedded job's cache): the
    embedded model warmed up four times as long on careful demonstrations (none forgets the carry; greedy validation
    accuracy 1.0)."""
    path = cfg.trainer.ref.model.path
    if path != EMBEDDED_TEACHER:
        return path
    from rl.tasks.embedded.cache import default_cache_dir
    from rl.tasks.embedded.prepare import WARMUP_STEPS, prepare_embedded_default

    teacher = prepare_embedded_default(os.path.join(run_dir, EMBEDDED_TEACHER), seed=cfg.trainer.seed,
                                       warmup_steps=4 * WARMUP_STEPS, cache_dir=default_cache_dir(), forget_rate=0.0)
    return str(teacher.model_path)
