"""Megatron's full-weight updates against fsdp2 on one worker, end to end through the real launcher: tensor
parallelism (TP=2), pipeline parallelism (PP=2, 1F1B) and both (TP=2 x PP=2 on 4 workers) run the same steps as the
reference and end with the same exported weights. Every run takes two mini-batches per rollout batch
(`tests.testing.parity.MINI_BATCHES`), so each step is two optimizer steps of megatron's distributed optimizer and
the second one trains with importance ratios != 1 and live clipping (the mini-batch parity of the other strategies
is test_parity_minibatch). Bounds as in `tests.testing.parity`.
"""

import pytest

from tests.testing.parity import CLIPPING, COMPARED, MINI_BATCHES, assert_same_run, run_layout, run_mini_batch_reference
from tests.testing.tiny_job import make_tiny_job

TP2 = ("trainer.policy.megatron_config.tensor_model_parallel_size=2",)
PP2 = ("trainer.policy.megatron_config.pipeline_model_parallel_size=2",)
# The tiny model has 4 attention (and key/value) heads and 2 layers: TP=2 and PP=2 divide them.
LAYOUTS = {
    "tp2": ("megatron", 2, True, (*MINI_BATCHES, *TP2)),
    "pp2": ("megatron", 2, True, (*MINI_BATCHES, *PP2)),
    "tp2-pp2": ("megatron", 4, True, (*MINI_BATCHES, *TP2, *PP2)),
}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory):
    return run_mini_batch_reference(str(tmp_path_factory.mktemp("reference")), job)


@pytest.mark.parametrize("name", LAYOUTS)
def test_megatron_steps_and_final_weights_match_the_reference(job, reference, tmp_path, name):
    got = run_layout(str(tmp_path / "run"), job, LAYOUTS[name])
    assert_same_run(reference, got, job, f"megatron-{name}", compared=COMPARED + CLIPPING)
