"""Two mini-batches per rollout batch, end to end through the real launcher: fsdp2, fsdp and deepspeed on 2 workers,
and megatron's full-weight updates with tensor and pipeline parallelism together (TP=2 x PP=2 on 4 workers, 1F1B),
run the same steps as fsdp2 on one worker with the same mini-batches and end with the same exported weights. Each
step is two optimizer steps; the second mini-batch trains on weights the first already moved, so the importance
ratio leaves 1 and the clipped surrogate clips (asserted on the reference; every run must match its clip fraction and
ppo_kl). Bounds as in `tests.testing.parity`. (TP=2 alone and PP=2 alone against one rank, with several
micro-batches, are layouts of `tests/rl/backends/megatron/test_parity.py`; the one run here takes both through two
optimizer steps per batch.)
"""

import pytest

from tests.testing.parity import CLIPPING, COMPARED, MINI_BATCHES, assert_same_run, run_layout, run_mini_batch_reference
from tests.testing.tiny_job import make_tiny_job

TP2 = ("trainer.policy.megatron_config.tensor_model_parallel_size=2",)
PP2 = ("trainer.policy.megatron_config.pipeline_model_parallel_size=2",)
# The tiny model has 4 attention (and key/value) heads and 2 layers: TP=2 and PP=2 divide them.
LAYOUTS = {
    **{f"{strategy}-2w": (strategy, 2, True, MINI_BATCHES) for strategy in ("fsdp2", "fsdp", "deepspeed")},
    "megatron-tp2-pp2": ("megatron", 4, True, (*MINI_BATCHES, *TP2, *PP2)),
}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory):
    return run_mini_batch_reference(str(tmp_path_factory.mktemp("reference")), job)


@pytest.mark.parametrize("name", LAYOUTS)
def test_mini_batch_steps_and_final_weights_match_the_reference(job, reference, tmp_path, name):
    got = run_layout(str(tmp_path / "run"), job, LAYOUTS[name])
    assert_same_run(reference, got, job, f"{name}-mini-batches", compared=COMPARED + CLIPPING)
