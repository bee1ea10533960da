"""`trainer.exact_on_policy` through the launcher on the tiny job: 2 workers, packed micro-batches of one or two
sequences, two mini-batches per step, the HF engine in the driver, for each strategy whose forward is the Hugging
Face model's.

Oracle: the engine's sampling logprobs, which with the mode on are the old logprobs of the loss: the first
mini-batch's training forward, on both ranks and in every micro-batch, must give them to the bit
(`exact_logprob_gap` 0.0 at every step, the second after a weight push), where a run without the mode differs from
them in float32's last bits. The arithmetic itself, token by token against the trainer's packed forward, is
`tests/rl/backends/test_exact_on_policy.py`."""

import os

import pytest

from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

STEPS = 2
RUN = ["data.reward_fn=gsm8k_flexible", "trainer.placement.policy_num_gpus_per_node=2",
       "trainer.policy_mini_batch_size=2", "trainer.micro_train_batch_size_per_gpu=2"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _rows(job, run_dir: str, extra: list[str]) -> tuple[list[dict], str]:
    result = run_train(run_dir, [*job.overrides(steps=STEPS), *RUN, *extra])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    return rows, result.stdout


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp", "deepspeed"])
def test_the_first_mini_batch_takes_the_engines_logprobs_to_the_bit(job, strategy, tmp_path):
    rows, stdout = _rows(job, str(tmp_path / strategy),
                         [f"trainer.strategy={strategy}", "trainer.exact_on_policy=true"])
    assert "placement: 2 training worker(s)" in stdout
    for row in rows:
        assert row["exact_logprob_gap"] == 0.0, row
        assert row["rollout_logprob_abs_diff_max"] == 0.0  # the corrections see the engine's logprobs as the old ones
