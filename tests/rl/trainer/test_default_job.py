"""The embedded default job as the README runs it: `python -m rl.launch.train --run_dir=DIR`, synchronous, 40 GRPO
steps. The one override, `trainer.logger`, adds TensorBoard beside the console and changes no number.

Oracles: learning itself (greedy validation accuracy at step 40 at least 0.7, the bound the README's figures clear:
0.925 for seed 42, 0.855 and 0.905 for seeds 1 and 2, and above step 0's), and metrics.jsonl for what the other
sinks must hold: TensorBoard's event file (read back with TensorBoard's own reader) has every logged scalar at
every step with the same value, and curves.png draws both curves (pixels of both line colours)."""

import math
import os

import numpy as np
import pytest
import torch

from rl.trainer.state.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.tiny_job import run_train

STEPS = 40
FLOAT32_U = tolerances.unit_roundoff(torch.float32)
MIN_FINAL_ACCURACY = 0.7
# matplotlib's first two cycle colours: reward_mean, then val_accuracy (rl/trainer/state/plots.py)
LINE_COLOURS = {"reward_mean": (0x1F, 0x77, 0xB4), "val_accuracy": (0xFF, 0x7F, 0x0E)}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("default"))
    result = run_train(run_dir, ["trainer.logger=[console,tensorboard]"], timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return run_dir, read_metrics(os.path.join(run_dir, "metrics.jsonl"))


def test_default_job_learns(default_run):
    _, rows = default_run
    assert [row["step"] for row in rows] == list(range(STEPS + 1)), "step 0 (validation) then 40 training steps"
    accuracy = {row["step"]: row["val_accuracy"] for row in rows if "val_accuracy" in row}
    assert sorted(accuracy) == list(range(0, STEPS + 1, 5)), "validation before training and every 5 steps"
    print("validation accuracy every 5 steps:", [accuracy[step] for step in sorted(accuracy)])
    assert accuracy[STEPS] >= MIN_FINAL_ACCURACY, accuracy
    assert accuracy[STEPS] > accuracy[0], accuracy
    # the HF engine with one mini-batch skips the old-logprob pass; the update's forward measures the gap instead
    gaps = [row["rollout_logprob_abs_diff_mean"] for row in rows if row["step"] > 0]
    assert len(gaps) == STEPS and all(math.isfinite(gap) for gap in gaps), gaps
    print("trainer-vs-engine logprob gap, largest of the steps:", max(gaps))


def test_tensorboard_holds_every_logged_scalar(default_run):
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    run_dir, rows = default_run
    events = EventAccumulator(os.path.join(run_dir, "tensorboard"), size_guidance={SCALARS: 0})
    events.Reload()
    logged: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float):
                logged.setdefault(key, {})[row["step"]] = float(value)
    assert {"reward_mean", "loss", "grad_norm", "val_accuracy"} <= logged.keys()
    assert set(events.Tags()[SCALARS]) == logged.keys()
    for key, want in logged.items():
        got = {event.step: event.value for event in events.Scalars(key)}
        assert got.keys() == want.keys(), key
        for step, value in want.items():  # TensorBoard stores float32: one rounding, within u|value|
            assert math.isclose(got[step], value, rel_tol=FLOAT32_U), (key, step, got[step], value)


def test_curves_png_draws_reward_and_accuracy(default_run):
    from matplotlib.image import imread

    run_dir, _ = default_run
    image = imread(os.path.join(run_dir, "curves.png"))
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    rgb = np.rint(image[..., :3] * 255).astype(int)
    for key, colour in LINE_COLOURS.items():
        pixels = int((np.abs(rgb - np.array(colour)).max(-1) <= 8).sum())
        assert pixels > 50, f"{key}'s line ({pixels} pixels of its colour)"
