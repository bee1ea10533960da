"""Two mini-batches per rollout batch, end to end through the real launcher: fsdp2, fsdp and deepspeed on 2 workers
run the same steps as fsdp2 on one worker with the same mini-batches and end with the same exported weights. The
second mini-batch of each step trains on weights the first already moved, so the importance ratio leaves 1 and the
clipped surrogate clips (asserted on the reference; every run must match its clip fraction and ppo_kl). Megatron's
mini-batch runs are in test_parity_megatron. Bounds as in `tests.testing.parity`.
"""

import pytest

from tests.testing.parity import CLIPPING, COMPARED, MINI_BATCHES, assert_same_run, run_layout, run_mini_batch_reference
from tests.testing.tiny_job import make_tiny_job

LAYOUTS = {strategy: (strategy, 2, True, MINI_BATCHES) for strategy in ("fsdp2", "fsdp", "deepspeed")}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory):
    return run_mini_batch_reference(str(tmp_path_factory.mktemp("reference")), job)


@pytest.mark.parametrize("name", LAYOUTS)
def test_mini_batch_steps_and_final_weights_match_the_reference(job, reference, tmp_path, name):
    got = run_layout(str(tmp_path / "run"), job, LAYOUTS[name])
    assert_same_run(reference, got, job, f"{name}-2w-mini-batches", compared=COMPARED + CLIPPING)
