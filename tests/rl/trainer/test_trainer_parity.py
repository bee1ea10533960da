"""The parity contract, end to end through the real launcher (Ray actors, one gloo group): fsdp and deepspeed on one
worker with packing, and fsdp2 on one worker without it (padded rows), run the same few steps as fsdp2 on 1 worker
with packing (fp32) and end with the same weights. Packed or padded rows are the model forward's
(`rl/backends/hf_forward.py`, `hf_model.py`), which no strategy wraps differently, so one padded run holds that
path. Any backend added later joins LAYOUTS. Each strategy on 2 workers runs in test_parity_minibatch, where each
of a step's two mini-batches is one optimizer step over both workers.

The run and its comparison (rewards exactly, loss, its parts and the gradient norm up to summation order, final
weights within Adam's bounds, `tolerances.assert_adam_runs_within`) are `tests.testing.parity`'s, shared with
test_parity_features (ZeRO-3, the fused loss, Ulysses, context parallelism) and test_parity_minibatch (two
mini-batches per rollout batch, megatron's TP x PP among them): one target each, so that none runs more than ~10
launcher runs.
"""

import pytest

from tests.testing.parity import REFERENCE, assert_same_run, run_layout
from tests.testing.tiny_job import make_tiny_job

LAYOUTS = [("fsdp", 1, True, ()), ("deepspeed", 1, True, ()), ("fsdp2", 1, False, ())]


def _layout_id(layout) -> str:
    strategy, workers, packed, _ = layout
    return f"{strategy}-{workers}w-{'packed' if packed else 'padded'}"


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
