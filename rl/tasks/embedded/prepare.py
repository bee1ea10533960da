"""Prepare the embedded default job: task data, tokenizer and a warmed-up small model, under one work directory.

Layout of `workdir`: `data/train.parquet`, `data/validation.parquet` (the prompt-file layout `rl.core.data` reads)
and `model/` (an HF checkpoint with the tokenizer). `model/` is built in a temporary directory and renamed into
place with its marker file `embedded.json` written last, so a half-built checkpoint is never used; a call whose
recipe matches the marker of an existing checkpoint reuses it. With a `cache_dir` the checkpoint is copied from a
per-user cache entry (`rl.tasks.embedded.cache`), built there first when it is missing or damaged.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from rl.tasks.embedded.cache import EMBEDDED_FAMILY, Family, cached_checkpoint, file_digests
from rl.tasks.embedded.model import build_model, save_pretrained_model, tiny_model_config
from rl.tasks.embedded.task import SPLIT_FILES, make_task_rows, write_task_dataset
from rl.tasks.embedded.tokenizer import build_tokenizer
from rl.tasks.embedded.warmup import careless_demonstrations, greedy_accuracy, sft_warmup

MARKER = "embedded.json"
RECIPE_VERSION = 3  # 3: the warm-up is an rl.launch.sft run
DEFAULT_SEED = 42
WARMUP_STEPS = 300
MAX_NEW_TOKENS = 32


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the prepared job; a checkpoint is reused only when its recipe is equal."""

    seed: int = DEFAULT_SEED
    warmup_steps: int = WARMUP_STEPS
    warmup_lr: float = 3e-3
    warmup_batch_size: int = 64
    forget_rate: float = 0.75
    model_size: str = "tiny"
    n_train: int = 4000
    n_val: int = 200
    version: int = RECIPE_VERSION


@dataclass(frozen=True)
class EmbeddedDefault:
    """Paths for `trainer.policy.model.path`, `data.train_data` and `data.val_data`, and the warm-up's figures."""

    model_path: Path
    train_data: Path
    val_data: Path
    metrics: dict[str, float] = field(default_factory=dict)


def prepare_embedded_default(
    workdir: str | Path,
    seed: int = DEFAULT_SEED,
    warmup_steps: int = WARMUP_STEPS,
    log: Callable[[str], None] | None = print,
    cache_dir: str | Path | None = None,
    forget_rate: float = Recipe.forget_rate,
) -> EmbeddedDefault:
    """Write the task data and build the warmed-up model under `workdir`, or reuse what a previous call built;
    with `cache_dir`, the model comes from (and is built once in) that cache. `forget_rate`: the share of
    carrying demonstrations written carelessly (0 for the embedded teacher)."""
    root = Path(workdir).expanduser()
    recipe = Recipe(seed=seed, warmup_steps=warmup_steps, forget_rate=forget_rate)
    data_dir, model_dir = root / "data", root / "model"
    train_path, val_path = data_dir / SPLIT_FILES["train"], data_dir / SPLIT_FILES["validation"]
    marker = read_marker(model_dir)
    reuse = marker.get("recipe") == asdict(recipe) and isinstance(marker.get("metrics"), dict)
    if not (reuse and train_path.is_file() and val_path.is_file()):
        write_task_dataset(data_dir, recipe.n_train, recipe.n_val, recipe.seed)
    if reuse:
        metrics = marker["metrics"]
        if log is not None:
            log(f"embedded default: reusing {model_dir} (greedy validation accuracy {metrics['val_accuracy']:.3f})")
    else:
        metrics = copy_from_cache(model_dir, recipe, Path(cache_dir), log) if cache_dir is not None else None
        if metrics is None:
            metrics = build_checkpoint(model_dir, recipe, log)
    return EmbeddedDefault(model_path=model_dir, train_data=train_path, val_data=val_path, metrics=metrics)


def write_untrained_job(
    workdir: str | Path, seed: int, n_train: int = 64, n_val: int = 8, model_size: str = "tiny"
) -> EmbeddedDefault:
    """The embedded tokenizer, a randomly initialised `model_size` model and the task data, without the warm-up:
    the job tests and benchmarks train from scratch for a few steps."""
    root = Path(workdir).expanduser()
    tokenizer = build_tokenizer()
    model = build_model(tiny_model_config(tokenizer, model_size), seed)
    model_path = save_pretrained_model(model, tokenizer, root / "model")
    train, val = write_task_dataset(root / "data", n_train, n_val, seed)
    return EmbeddedDefault(model_path=model_path, train_data=train, val_data=val)


def read_marker(model_dir: Path) -> dict:
    """The marker of a completed checkpoint, or {} when there is none or it cannot be read."""
    try:
        return json.loads((model_dir / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def build_checkpoint(model_dir: Path, recipe: Recipe, log: Callable[[str], None] | None) -> dict[str, float]:
    """Warm the model up in a temporary directory, then move its export to `model_dir`."""
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.", dir=model_dir.parent))
    try:
        metrics, export = warm_up_model(work, recipe, log)
        seal(export, model_dir, recipe, metrics)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return metrics


def seal(staging: Path, model_dir: Path, recipe, metrics: dict[str, float]) -> None:
    """Write the marker into the built checkpoint `staging` (its recipe, figures and every file's digest), then
    install it as `model_dir`."""
    marker = {"recipe": asdict(recipe), "metrics": metrics, "files": file_digests(staging)}
    (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    install(staging, model_dir, recipe)


def copy_from_cache(model_dir: Path, recipe, cache_dir: Path, log: Callable[[str], None] | None,
                    build: Callable[[Path], object] | None = None, family: Family = EMBEDDED_FAMILY
                    ) -> dict[str, float] | None:
    """Install a copy of the cache's verified entry for `recipe` as `model_dir` (made by `build`, this job's
    `build_checkpoint` unless given, under `family`'s folder); its metrics, or None where the cache cannot be
    written."""
    build = build or (lambda directory: build_checkpoint(directory, recipe, log))
    entry = cached_checkpoint(recipe, cache_dir, build, log, family)
    if entry is None:
        return None
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.", dir=model_dir.parent))
    try:
        shutil.copytree(entry, staging, dirs_exist_ok=True)
        install(staging, model_dir, recipe)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return read_marker(model_dir)["metrics"]


def warm_up_model(work: Path, recipe: Recipe, log: Callable[[str], None] | None) -> tuple[dict[str, float], Path]:
    """The untrained model and its demonstrations under `work`, the warm-up's `rl.launch.sft` run there (the default
    strategy, one worker), its export measured: (figures, the export's directory)."""
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer()
    untrained = save_pretrained_model(build_model(tiny_model_config(tokenizer, recipe.model_size), recipe.seed),
                                      tokenizer, work / "untrained")
    train = make_task_rows(recipe.n_train, recipe.seed, "train")
    if log is not None:
        log(f"embedded default: warming up a {recipe.model_size} model with rl.launch.sft for {recipe.warmup_steps} "
            "steps")
    run = sft_warmup(work / "sft", untrained, careless_demonstrations(train, recipe.forget_rate, recipe.seed),
                     "embedded default", seed=recipe.seed, steps=recipe.warmup_steps,
                     batch_size=recipe.warmup_batch_size, lr=recipe.warmup_lr)
    model = AutoModelForCausalLM.from_pretrained(run.export, dtype=torch.float32)
    validation = make_task_rows(recipe.n_val, recipe.seed, "validation")
    metrics = {
        "warmup_loss_first": run.losses[0],
        "warmup_loss_last": run.losses[-1],
        "warmup_seconds": run.seconds,
        "val_accuracy": greedy_accuracy(model, tokenizer, validation, MAX_NEW_TOKENS),
    }
    if log is not None:
        log(
            f"embedded default: warm-up took {metrics['warmup_seconds']:.1f}s, loss {metrics['warmup_loss_first']:.3f}"
            f" -> {metrics['warmup_loss_last']:.3f}, greedy validation accuracy {metrics['val_accuracy']:.3f}"
        )
    return metrics, run.export


def install(staging: Path, model_dir: Path, recipe) -> None:
    """Rename `staging` to `model_dir`, replacing an older checkpoint there; a matching one built meanwhile wins."""
    if model_dir.exists():
        if read_marker(model_dir).get("recipe") == asdict(recipe):
            return
        retired = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.old.", dir=model_dir.parent))
        os.replace(model_dir, retired / model_dir.name)
        shutil.rmtree(retired, ignore_errors=True)
    try:
        os.rename(staging, model_dir)
    except OSError as err:
        if read_marker(model_dir).get("recipe") != asdict(recipe):
            raise OSError(f"{model_dir}: cannot install the embedded checkpoint ({err}); remove the directory") from err
