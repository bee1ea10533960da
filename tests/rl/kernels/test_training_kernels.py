"""Training through the kernel dispatch: trainer.kernels=torch against triton (emulated by TRITON_INTERPRET=1 on
CPU), an independent implementation of the same formulas, take the same first step: rollouts, loss, its parts and
the gradient norm agree within the float32 bound of the computation they differ in. `auto` is its own run only where
it resolves to something other than torch (a GPU); on CPU it is torch's run, which the dispatch asserts."""

import json
import math

import pytest
import torch

from rl.kernels import ops
from rl.trainer.state.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.tiny_job import make_tiny_job, run_train

NONZERO = ["data.reward_fn=gsm8k_flexible", "trainer.algorithm.use_entropy_loss=true"]
COMPARED = ("loss", "pg_loss", "entropy", "grad_norm")
SEQUENCES = 16  # 4 prompts x 4 samples (tiny_job)


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


def _assert_same_step(got: dict, want: dict, model_path: str) -> None:
    """The kernels differ only in the log-softmax and entropy over the vocabulary (forward and backward); the
    model's forward and backward around them run the same code. `tolerances.network_rtol` over the vocabulary's
    sum, the token sums of the loss and of each weight gradient (at most every position of every sequence), and the
    layers the per-logit gradient's difference flows back through bounds their relative gap. The compared values
    are means of per-token terms no larger than max(1, log V) (normalized advantages times ratios near 1,
    entropies <= log V), the scale of the absolute bound."""
    with open(f"{model_path}/config.json", encoding="utf-8") as f:
        config = json.load(f)
    positions = config["max_position_embeddings"]
    rtol = tolerances.network_rtol(tolerances.decoder_reductions(config, positions, SEQUENCES * positions),
                                   torch.float32)
    scale = max(1.0, math.log(config["vocab_size"]))
    assert got["reward_mean"] == want["reward_mean"]
    assert want["grad_norm"] > 0
    for key in COMPARED:
        assert got[key] == pytest.approx(want[key], rel=rtol, abs=rtol * scale), key


def test_interpreted_triton_kernels_take_torchs_first_step(job, torch_step, tmp_path):
    got = _first_step(str(tmp_path / "run"), job, "triton", {"TRITON_INTERPRET": "1"})
    _assert_same_step(got, torch_step, job.model_path)


def test_auto_kernels_take_torchs_first_step(job, tmp_path, request):
    if not torch.cuda.is_available():
        # auto is the torch reference on CPU tensors: the torch run is auto's run here.
        assert ops.resolve("auto", torch.zeros(1)) == "torch"
        return
    got = _first_step(str(tmp_path / "run"), job, "auto")
    _assert_same_step(got, request.getfixturevalue("torch_step"), job.model_path)
