"""The parity contract, end to end through the real launcher (Ray actors, one gloo group): every strategy, with 1 and
2 workers, packed (and padded on 1), runs the same few steps as fsdp2 on 1 worker with packing (fp32), and ends with the
same weights; so do fsdp2 and megatron with the fused chunked loss (`trainer.policy.use_fused_kernels`), and fsdp2
and fsdp with Ulysses over both workers (`trainer.policy.sequence_parallel_size=2`), and megatron with context
parallelism (`megatron_config.context_parallel_size=2`). Any
backend added later joins LAYOUTS.

The run and its comparison (rewards exactly, loss, its parts and the gradient norm up to summation order, final
weights within WEIGHT_ATOL) are `tests.testing.parity`'s, shared with test_parity_megatron (TP and PP) and
test_parity_minibatch (several mini-batches per rollout batch).
"""

import itertools

import pytest

from tests.testing.parity import REFERENCE, assert_same_run, run_layout
from tests.testing.tiny_job import make_tiny_job

ZERO3 = ("deepspeed_config.train.zero_optimization.stage=3",)
FUSED = ("trainer.policy.use_fused_kernels=true",)
ULYSSES = ("trainer.policy.sequence_parallel_size=2",)  # one data-parallel shard split over the two workers
CONTEXT = ("trainer.policy.megatron_config.context_parallel_size=2",)  # megatron's counterpart
# Padding is the batch format, the same whatever the number of workers: each strategy runs it on one worker.
LAYOUTS = [
    (strategy, workers, packed, ())
    for strategy, workers, packed in itertools.product(("fsdp2", "fsdp", "deepspeed"), (1, 2), (True, False))
    if (strategy, workers, packed, ()) != REFERENCE and (packed or workers == 1)
] + [("deepspeed", 2, True, ZERO3), ("fsdp2", 2, True, FUSED), ("megatron", 2, True, FUSED),
      ("fsdp2", 2, True, ULYSSES), ("fsdp", 2, True, ULYSSES), ("megatron", 2, True, CONTEXT)]


def _layout_id(layout) -> str:
    strategy, workers, packed, extra = layout
    suffix = {(): "", ZERO3: "-zero3", FUSED: "-fused-loss", ULYSSES: "-ulysses", CONTEXT: "-context-parallel"}[extra]
    return f"{strategy}-{workers}w-{'packed' if packed else 'padded'}{suffix}"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory):
    return run_layout(str(tmp_path_factory.mktemp("reference")), job, REFERENCE)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[_layout_id(layout) for layout in LAYOUTS])
def test_steps_and_final_weights_match_the_reference(job, reference, tmp_path, layout):
    got = run_layout(str(tmp_path / "run"), job, layout)
    assert_same_run(reference, got, job, _layout_id(layout))
