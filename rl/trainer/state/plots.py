"""The reward / validation-accuracy curve of a run, as a PNG beside its metrics."""

from __future__ import annotations

import os

from rl.trainer.state.metrics import read_metrics


def plot_curves(run_dir: str) -> str | None:
    """The PNG's path; None when the run logged nothing (resumed from a checkpoint of its last step)."""
    from matplotlib.figure import Figure  # not pyplot: no GUI backend to import or select

    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(metrics):
        return None
    rows = read_metrics(metrics)
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for key, style in (("reward_mean", "-"), ("val_accuracy", "o-")):
        points = [(row["step"], row[key]) for row in rows if key in row]
        if points:
            ax.plot(*zip(*points, strict=True), style, label=key)
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(os.path.basename(os.path.abspath(run_dir)))
    path = os.path.join(run_dir, "curves.png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path
