"""Checkpoint directories that are complete and intact, or ignored: written under a `.partial` name, a manifest of
every file (size and sha256) and then the marker file written last inside, then renamed. `verify` checks a
directory against its manifest; `latest` returns the newest checkpoint that verifies, saying which newer ones it
passed over and why."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil

MARKER = "COMPLETE"
TRAINER_STATE = "trainer_state.json"
MANIFEST = "MANIFEST.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def root_of(cfg, run_dir: str) -> str:
    """Where a run's checkpoints go: trainer.ckpt_path, else RUN_DIR/checkpoints."""
    return cfg.trainer.ckpt_path or os.path.join(run_dir, "checkpoints")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def staging_dir(root: str, step: int) -> str:
    """Where the backends write step `step`; a leftover from an interrupted save is removed first."""
    path = step_dir(root, step) + ".partial"
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: str) -> list[str]:
    """Every file below `directory`, relative, except the manifest and the marker."""
    found = []
    for parent, _, names in os.walk(directory):
        for name in names:
            relative = os.path.relpath(os.path.join(parent, name), directory)
            if relative not in (MANIFEST, MARKER):
                found.append(relative)
    return sorted(found)


def write_manifest(directory: str) -> None:
    manifest = {rel: {"bytes": os.path.getsize(os.path.join(directory, rel)),
                      "sha256": _sha256(os.path.join(directory, rel))} for rel in _files(directory)}
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)


def verify(path: str) -> list[str]:
    """What is wrong with checkpoint `path` against its manifest: missing, resized or changed files (by sha256),
    files it does not list. Empty when intact. A checkpoint written before manifests existed has none to check."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        return []
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as error:
        return [f"{MANIFEST} is unreadable ({error})"]
    problems = []
    for rel, entry in sorted(manifest.items()):
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            problems.append(f"{rel} is missing")
        elif os.path.getsize(full) != entry["bytes"]:
            problems.append(f"{rel} has {os.path.getsize(full)} bytes, {entry['bytes']} were written")
        elif _sha256(full) != entry["sha256"]:
            problems.append(f"{rel} does not match its checksum (changed since it was written)")
    problems += [f"{rel} was not part of the checkpoint" for rel in _files(path) if rel not in manifest]
    return problems


def commit(root: str, step: int, trainer_state: dict) -> str:
    """Writes the trainer state, the manifest and the marker into the staging dir, then gives it its final name."""
    staging, final = step_dir(root, step) + ".partial", step_dir(root, step)
    with open(os.path.join(staging, TRAINER_STATE), "w") as f:
        json.dump(trainer_state, f, indent=2)
    write_manifest(staging)
    with open(os.path.join(staging, MARKER), "w") as f:
        f.write(f"step {step}\n")
        f.flush()
        os.fsync(f.fileno())
    if os.path.isdir(final):
        shutil.rmtree(final)
    os.replace(staging, final)
    return final


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MARKER)) and bool(_STEP_DIR.match(os.path.basename(path)))


def latest(root: str, log=print) -> str | None:
    """The complete checkpoint with the highest step under `root` that verifies against its manifest, or None;
    each newer complete one passed over is logged with what is wrong with it."""
    if not os.path.isdir(root):
        return None
    steps = sorted((int(m.group(1)), name) for name in os.listdir(root) if (m := _STEP_DIR.match(name)))
    for _, name in reversed(steps):
        path = os.path.join(root, name)
        if not is_complete(path):
            continue
        problems = verify(path)
        if not problems:
            return path
        log(f"checkpoint {path} is damaged ({'; '.join(problems)}); trying an older one")
    return None


def read_trainer_state(path: str) -> dict:
    with open(os.path.join(path, TRAINER_STATE)) as f:
        return json.load(f)


def strategy_mismatch(path: str, strategy: str) -> str | None:
    """Why checkpoint `path` cannot be resumed under `strategy` (written by another one), with the way across."""
    written_by = read_trainer_state(path).get("strategy")
    if written_by in (None, strategy):
        return None
    return (f"{path} was written by the {written_by} strategy and this run uses {strategy}; optimizer state does not "
            f"carry across strategies. Convert its weights with `bazel run //rl/launch:convert -- "
            f"--direction=checkpoint_to_hf --input={path} --run_dir=HF_DIR` and start a new run from them with "
            f"trainer.policy.model.path=HF_DIR, or resume with --strategy={written_by}")


def prune(root: str, keep: int, scores: dict[int, float] | None = None, higher_is_better: bool = True,
          log=print) -> list[str]:
    """Removes complete checkpoints under `root` beyond `keep` (-1: none): the newest always stays, with the `keep`
    best by `scores` (step -> value; a step without one ranks last, ties go to the newer) or, without scores, the
    `keep` newest. Returns the removed paths."""
    if keep == -1 or not os.path.isdir(root):
        return []
    steps = sorted(int(m.group(1)) for name in os.listdir(root)
                   if (m := _STEP_DIR.match(name)) and is_complete(os.path.join(root, name)))
    if scores is None:
        ranked = sorted(steps, reverse=True)
    else:  # best first: by score (a step without one last), then the newer
        sign = 1 if higher_is_better else -1
        ranked = sorted(steps, key=lambda step: (sign * scores[step] if step in scores else -math.inf, step),
                        reverse=True)
    kept = set(ranked[:keep]) | set(steps[-1:])
    removed = []
    for step in steps:
        if step not in kept:
            path = step_dir(root, step)
            shutil.rmtree(path)
            removed.append(path)
    if removed:
        log(f"checkpoints: removed {', '.join(os.path.basename(path) for path in removed)} "
            f"(trainer.max_ckpts_to_keep={keep})")
    return removed


def apply_retention(trainer_cfg, root: str, metrics_path: str, log=print) -> list[str]:
    """`prune` as `trainer.max_ckpts_to_keep` / `ckpt_keep_metric` / `ckpt_keep_higher_is_better` say, the scores
    read from the run's metrics.jsonl (each checkpoint's step row is logged before it is written); said once per
    checkpoint while no row holds the metric yet (a name no step logs would rank by recency alone)."""
    keep, metric = trainer_cfg.max_ckpts_to_keep, trainer_cfg.ckpt_keep_metric
    if keep == -1:
        return []
    scores = None
    if metric is not None:
        from rl.trainer.state.metrics import read_metrics

        rows = read_metrics(metrics_path) if os.path.exists(metrics_path) else []
        scores = {row["step"]: float(row[metric]) for row in rows
                  if isinstance(row.get(metric), int | float) and not isinstance(row.get(metric), bool)}
        if not scores:
            log(f"checkpoints: no metrics row holds trainer.ckpt_keep_metric={metric!r} yet, so every checkpoint "
                "ranks the same: the newest are kept")
    return prune(root, keep, scores, trainer_cfg.ckpt_keep_higher_is_better, log)
