"""Where the model and the prompts of a run come from: paths as given, or a built-in job.

`trainer.policy.model.path=embedded` and data lists holding `embedded` select the embedded default job: a small model
made locally with the project's own tokenizer, briefly warmed up on a synthetic task written in GSM8K's answer format
(once per machine: the warmed-up model is kept in a per-user cache, `rl.tasks.embedded.cache`). `embedded-vl` selects
the visual one: a tiny Qwen2-VL warmed up by an SFT run to count squares in an image (`rl.tasks.embedded_vl`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

EMBEDDED = "embedded"
EMBEDDED_VL = "embedded-vl"  # rl.tasks.embedded_vl.prepare.EMBEDDED_VL
EMBEDDED_JOBS = (EMBEDDED, EMBEDDED_VL)  # built-in jobs: a model path and a data-file entry
EMBEDDED_TEACHER = "embedded_teacher"
BUILT_MODELS = (*EMBEDDED_JOBS, EMBEDDED_TEACHER)  # model paths built at the start, not read from a directory


@dataclass(frozen=True)
class Sources:
    model_path: str
    train_data: list[str]
    val_data: list[str]
    ref_path: str | None = None  # trainer.ref.model.path resolved (None: the policy's starting weights)


def embedded_jobs(cfg) -> list[str]:
    """The built-in jobs a config names (its model path or data entries)."""
    named = (cfg.trainer.policy.model.path, *cfg.data.train_data, *(cfg.data.val_data or []))
    return [name for name in EMBEDDED_JOBS if name in named]


def uses_embedded(cfg) -> bool:
    return bool(embedded_jobs(cfg))


def prepare_job(name: str, workdir: str, seed: int):
    """A built-in job's model and data under `workdir` (its model from the per-user cache)."""
    from rl.tasks.embedded.cache import default_cache_dir

    if name == EMBEDDED_VL:
        from rl.tasks.embedded_vl.prepare import prepare_embedded_vl

        return prepare_embedded_vl(workdir, seed=seed, cache_dir=default_cache_dir())
    from rl.tasks.embedded.prepare import prepare_embedded_default

    return prepare_embedded_default(workdir, seed=seed, cache_dir=default_cache_dir())


def resolve_sources(cfg, run_dir: str) -> Sources:
    model_path, train, val = cfg.trainer.policy.model.path, list(cfg.data.train_data), list(cfg.data.val_data or [])
    for name in embedded_jobs(cfg):
        job = prepare_job(name, os.path.join(run_dir, name), cfg.trainer.seed)
        model_path = job.model_path if model_path == name else model_path
        train = [job.train_data if path == name else path for path in train]
        val = [job.val_data if path == name else path for path in val]
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


def looks_local(path: str) -> bool:
    """A filesystem path rather than a hub name (`org/name`): absolute, relative with ./ or ../, under ~, deeper
    than org/name, or whose first part is a local directory."""
    return (path.startswith(("/", ".", "~")) or path.count("/") > 1
            or (os.path.isdir(path.split("/")[0]) and "/" in path))


def model_at_hand(path: str) -> bool:
    """A local model directory, or a hub name in the local cache (not a built-in model, built at the start)."""
    if path in BUILT_MODELS:
        return False
    if looks_local(path):
        return os.path.isfile(os.path.join(os.path.expanduser(path), "config.json"))
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(path, "config.json"), str)
