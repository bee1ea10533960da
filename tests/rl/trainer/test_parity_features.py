"""The parity contract, end to end through the real launcher (Ray actors, one gloo group): fsdp2 on one worker
without packing (padded rows), and the features that change how a step is computed (the fused chunked loss,
`trainer.policy.use_fused_kernels`, under fsdp2 and megatron; Ulysses over both workers,
`trainer.policy.sequence_parallel_size=2`, under fsdp2; megatron's context parallelism,
`megatron_config.context_parallel_size=2`) run the same steps as fsdp2 on 1 worker with packing (fp32) and end with
the same weights. The run and its comparison (rewards exactly, loss, its parts and the gradient norm up to summation
order, final weights within Adam's bounds, `tolerances.assert_adam_runs_within`) are `tests.testing.parity`'s.

Packed or padded rows are the model forward's (`rl/backends/hf_forward.py`, `hf_model.py`), which no strategy wraps
differently, so one padded run holds that path. Every strategy on 2 workers, two mini-batches a step, is
test_parity_minibatch (a backend added later joins its LAYOUTS); fsdp's Ulysses, alone and with DP=2, is
tests/rl/backends/test_ulysses.py's (the key reaches either backend the same way); ZeRO-3 on 2 workers is held to the
same reference in test_critic_training (its policy's steps and export, a critic beside it) and test_lora_training.
"""

import pytest

from tests.testing.parity import REFERENCE, assert_same_run, run_layout
from tests.testing.tiny_job import make_tiny_job

FUSED = ("trainer.policy.use_fused_kernels=true",)
ULYSSES = ("trainer.policy.sequence_parallel_size=2",)  # one data-parallel shard split over the two workers
CONTEXT = ("trainer.policy.megatron_config.context_parallel_size=2",)  # megatron's counterpart
LAYOUTS = {
    "fsdp2-1w-padded": ("fsdp2", 1, False, ()),
    "fsdp2-2w-fused-loss": ("fsdp2", 2, True, FUSED),
    "megatron-2w-fused-loss": ("megatron", 2, True, FUSED),
    "fsdp2-2w-ulysses": ("fsdp2", 2, True, ULYSSES),
    "megatron-2w-context-parallel": ("megatron", 2, True, CONTEXT),
}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory):
    return run_layout(str(tmp_path_factory.mktemp("reference")), job, REFERENCE)


@pytest.mark.parametrize("name", LAYOUTS)
def test_steps_and_final_weights_match_the_reference(job, reference, tmp_path, name):
    got = run_layout(str(tmp_path / "run"), job, LAYOUTS[name])
    assert_same_run(reference, got, job, name)
