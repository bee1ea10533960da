"""The embedded default trained asynchronously (`trainer.fully_async`, rollouts up to one step behind, the engine on
a core of its own) still learns: 0.7 validation accuracy at step 40, as the synchronous default does
(`test_default_job.py`). Kept apart from `test_async_training.py` so that neither target runs past 5 minutes."""

import os

from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import run_train

ASYNCHRONOUS = ["trainer.placement.colocate_all=false", "trainer.fully_async.enabled=true",
                "trainer.fully_async.max_staleness_steps=1"]


def test_embedded_default_learns_asynchronously(tmp_path):
    run_dir = str(tmp_path / "default")
    result = run_train(run_dir, [*ASYNCHRONOUS, "trainer.eval_interval=40"], timeout=900)  # steps 0 and 40
    assert result.returncode == 0, result.stderr[-5000:]
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    final = [row for row in rows if row["step"] == 40 and "val_accuracy" in row]
    assert final and final[0]["val_accuracy"] >= 0.7, [row.get("val_accuracy") for row in rows]
    assert max(row.get("policy_lag", 0) for row in rows) == 1
