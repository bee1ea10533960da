"""Checkpoint directories that are complete or ignored: written under a `.partial` name, the marker file written
last inside, then renamed. `latest` only ever returns a directory that has the marker."""

from __future__ import annotations

import json
import os
import re
import shutil

MARKER = "COMPLETE"
TRAINER_STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def staging_dir(root: str, step: int) -> str:
    """Where the backends write step `step`; a leftover from an interrupted save is removed first."""
    path = step_dir(root, step) + ".partial"
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def commit(root: str, step: int, trainer_state: dict) -> str:
    """Writes the trainer state and the marker into the staging dir, then gives it its final name."""
    staging, final = step_dir(root, step) + ".partial", step_dir(root, step)
    with open(os.path.join(staging, TRAINER_STATE), "w") as f:
        json.dump(trainer_state, f, indent=2)
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


def latest(root: str) -> str | None:
    """The complete checkpoint with the highest step under `root`, or None."""
    if not os.path.isdir(root):
        return None
    steps = sorted((int(m.group(1)), name) for name in os.listdir(root) if (m := _STEP_DIR.match(name)))
    for _, name in reversed(steps):
        if is_complete(os.path.join(root, name)):
            return os.path.join(root, name)
    return None


def read_trainer_state(path: str) -> dict:
    with open(os.path.join(path, TRAINER_STATE)) as f:
        return json.load(f)
