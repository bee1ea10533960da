"""Prepare the embedded visual job: the square-counting task's data and a tiny Qwen2-VL warmed up by an SFT run.

Layout of `workdir`, as the text job's (`rl.tasks.embedded.prepare`): `data/train.parquet`,
`data/validation.parquet` (prompt rows with one image each) and `model/` (the checkpoint with its processor's
files). The warm-up is `rl.launch.sft` (the default strategy, one worker) from the untrained model (the recipe's
seed) on demonstrations that skip the last quadrant on a `careless_share` of the problems whose last quadrant holds
squares, so the warmed-up model is careless (greedy validation accuracy 0.1-0.3) and GRPO, rewarded on the final answer,
has a behaviour to reinforce. Built once per machine in the embedded cache (`embedded-vl/<key>`), checked on reuse.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from rl.tasks.embedded.cache import Family
from rl.tasks.embedded.prepare import EmbeddedDefault, copy_from_cache, read_marker, seal
from rl.tasks.embedded.warmup import RESPONSE_KEY, sft_warmup

EMBEDDED_VL = "embedded-vl"
FAMILY = Family(name=EMBEDDED_VL, sources=Path(__file__).parent, files=("model.py", "prepare.py", "task.py"))
SPLIT_FILES = {"train": "train.parquet", "validation": "validation.parquet"}
GREEDY_MAX_NEW_TOKENS = 24


@dataclass(frozen=True)
class VlRecipe:
    """Everything that determines the prepared job; a checkpoint is reused only when its recipe is equal."""

    seed: int = 42
    warmup_steps: int = 300
    warmup_lr: float = 3e-3
    warmup_batch_size: int = 32
    careless_share: float = 0.75
    n_train: int = 2000
    n_val: int = 64
    version: int = 3  # 2: head_dim 32; 3: a one-thread warm-up


def prepare_embedded_vl(workdir: str | Path, seed: int = VlRecipe.seed, log: Callable[[str], None] | None = print,
                        cache_dir: str | Path | None = None) -> EmbeddedDefault:
    """Write the task data and build the warmed-up model under `workdir`, or reuse what a previous call built;
    with `cache_dir`, the model comes from (and is built once in) that cache."""
    root, recipe = Path(workdir).expanduser(), VlRecipe(seed=seed)
    data_dir, model_dir = root / "data", root / "model"
    train_path, val_path = data_dir / SPLIT_FILES["train"], data_dir / SPLIT_FILES["validation"]
    if not (train_path.is_file() and val_path.is_file()):
        write_task_data(data_dir, recipe)
    marker = read_marker(model_dir)
    if marker.get("recipe") == asdict(recipe) and isinstance(marker.get("metrics"), dict):
        metrics = marker["metrics"]
    else:
        build = lambda directory: build_checkpoint(directory, recipe, log)  # noqa: E731
        metrics = copy_from_cache(model_dir, recipe, Path(cache_dir), log, build, FAMILY) if cache_dir else None
        if metrics is None:
            metrics = build(model_dir)
    return EmbeddedDefault(model_path=model_dir, train_data=train_path, val_data=val_path, metrics=metrics)


def write_task_data(directory: Path, recipe: VlRecipe) -> tuple[Path, Path]:
    from rl.core.data.parquet_io import write_parquet_atomic
    from rl.tasks.embedded_vl.task import make_rows

    paths = tuple(directory / SPLIT_FILES[split] for split in ("train", "validation"))
    for split, count, path in zip(("train", "validation"), (recipe.n_train, recipe.n_val), paths, strict=True):
        write_parquet_atomic(make_rows(count, recipe.seed, split), path)
    return paths


def careless_rows(rows: list[dict], share: float, seed: int) -> list[dict]:
    """The rows with a seeded `share` of those whose careless response is wrong answered carelessly."""
    wrong = [k for k, row in enumerate(rows) if row["careless_response"].split()[-1] != row["answer"]]
    chosen = set(random.Random(f"careless-vl/{seed}").sample(wrong, round(share * len(wrong))))
    return [{**row, RESPONSE_KEY: row["careless_response"]} if k in chosen else row for k, row in enumerate(rows)]


def build_checkpoint(model_dir: Path, recipe: VlRecipe, log: Callable[[str], None] | None) -> dict[str, float]:
    """The untrained model and its demonstrations in a temporary directory, the SFT run there, its export measured
    and marked, then moved to `model_dir`."""
    from rl.tasks.embedded_vl.model import build_model, build_processor, save_vl_model, tiny_vl_config
    from rl.tasks.embedded_vl.task import make_rows

    model_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.", dir=model_dir.parent))
    try:
        processor = build_processor()
        start = save_vl_model(build_model(tiny_vl_config(processor.tokenizer), recipe.seed), processor,
                              work / "untrained")
        rows = make_rows(recipe.n_train, recipe.seed, "train")
        if log is not None:
            log(f"{EMBEDDED_VL}: warming up the model with rl.launch.sft for {recipe.warmup_steps} steps")
        run = sft_warmup(work / "sft", start, careless_rows(rows, recipe.careless_share, recipe.seed), EMBEDDED_VL,
                         seed=recipe.seed, steps=recipe.warmup_steps, batch_size=recipe.warmup_batch_size,
                         lr=recipe.warmup_lr)
        losses, export = run.losses, run.export
        metrics = {"warmup_loss_first": losses[0], "warmup_loss_last": losses[-1],
                   "val_accuracy": greedy_accuracy(export, make_rows(recipe.n_val, recipe.seed, "validation"))}
        if log is not None:
            log(f"{EMBEDDED_VL}: warm-up loss {losses[0]:.3f} -> {losses[-1]:.3f}, greedy validation accuracy "
                f"{metrics['val_accuracy']:.3f}")
        seal(export, model_dir, recipe, metrics)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return metrics


def greedy_accuracy(model_path: Path, rows: list[dict]) -> float:
    """Greedy decoding of each validation row (its image and question) under the GSM8K verifier."""
    import io

    import torch
    from PIL import Image

    from rl.core.model_class import load_generative
    from rl.core.processors import load_processor
    from rl.tasks.embedded_vl.model import VISION_TOKENS
    from rl.tasks.gsm8k.rewards import gsm8k_reward

    processor = load_processor(str(model_path))
    model = load_generative(str(model_path), dtype=torch.float32).eval()
    never = [[token] for token in processor.tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))]
    correct = 0.0
    for row in rows:
        text = processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        images = [Image.open(io.BytesIO(entry["bytes"])).convert("RGB") for entry in row["images"]]
        inputs = processor(text=[text], images=images, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=GREEDY_MAX_NEW_TOKENS, do_sample=False, bad_words_ids=never)
        response = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        correct += float(gsm8k_reward(response, row["answer"]))
    return correct / len(rows)
