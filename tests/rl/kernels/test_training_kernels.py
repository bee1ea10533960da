"""Training through the kernel dispatch: trainer.kernels=torch, auto and triton (emulated by TRITON_INTERPRET=1 on
CPU) take the same first step: rollouts, loss, its parts and the gradient norm agree."""

import pytest

from rl.trainer.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

NONZERO = ["data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true"]
COMPARED = ("loss", "pg_loss", "entropy", "grad_norm")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _first_step(run_dir, job, kernels: str, env=None) -> dict:
    overrides = [*job.overrides(steps=1), *NONZERO, f"trainer.kernels={kernels}"]
    result = run_train(run_dir, overrides, env_extra=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return next(row for row in read_metrics(f"{run_dir}/metrics.jsonl") if row["step"] == 1)


@pytest.fixture(scope="module")
def torch_step(job, tmp_path_factory):
    return _first_step(str(tmp_path_factory.mktemp("torch")), job, "torch")


@pytest.mark.parametrize(
    ("kernels", "env"), [("auto", None), ("triton", {"TRITON_INTERPRET": "1"})], ids=["auto", "triton-interpreted"]
)
def test_first_step_matches_torch_kernels(job, torch_step, tmp_path, kernels, env):
    got = _first_step(str(tmp_path / "run"), job, kernels, env)
    assert got["reward_mean"] == torch_step["reward_mean"]
    assert torch_step["grad_norm"] > 0
    for key in COMPARED:
        assert got[key] == pytest.approx(torch_step[key], rel=1e-4, abs=1e-6), key
