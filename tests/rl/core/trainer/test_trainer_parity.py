"""End to end through the real launcher (Ray actors, gloo group, fsdp2): 2 workers vs 1, packed vs padded."""

import pytest

from rl.core.trainer.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


# A random model rarely earns the strict reward: the flexible verifier and an entropy bonus make step 1's gradient
# non-zero, so the comparison covers the whole loss.
NONZERO = ["data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true"]


def _first_step(tmp_path, name: str, overrides: list[str]) -> dict:
    run_dir = str(tmp_path / name)
    result = run_train(run_dir, [*overrides, *NONZERO])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(f"{run_dir}/metrics.jsonl")
    return next(row for row in rows if row["step"] == 1)


def _assert_same_update(a: dict, b: dict) -> None:
    assert a["reward_mean"] == b["reward_mean"], "generation must not depend on the training layout"
    assert a["grad_norm"] > 0
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "kl"):
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_two_workers_match_one_worker(job, tmp_path):
    one = _first_step(tmp_path, "one", job.overrides(steps=1))
    two = _first_step(tmp_path, "two", [*job.overrides(steps=1), "trainer.placement.policy_num_gpus_per_node=2"])
    _assert_same_update(one, two)


def test_packed_matches_padded(job, tmp_path):
    packed = _first_step(tmp_path, "packed", job.overrides(steps=1))
    padded = _first_step(tmp_path, "padded", [*job.overrides(steps=1), "trainer.use_sample_packing=false"])
    _assert_same_update(packed, padded)
