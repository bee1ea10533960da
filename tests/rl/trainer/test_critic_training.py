"""PPO with a critic (`advantage_estimator=gae`) end to end through the real launcher: the same steps on every
strategy, and the critic's warm-up.

Parity: fsdp on 2 workers, DeepSpeed ZeRO-3 on 2 workers and megatron with TP=2 run the steps of fsdp2 on one worker
(two PPO epochs per batch, a critic trained beside the policy): the same rewards, losses, value losses and gradient
norms up to summation order, and policy and critic exports within Adam's bounds of the reference's
(`tests.testing.parity`). The critic's lr is raised so that its weights move far beyond those bounds.
Warm-up: with `trainer.critic_warmup=2` the first two steps train the critic only: no policy loss is logged and the
exported policy is the starting model bit for bit. The same run's last checkpoint, converted with
`rl.launch.convert --model=critic`, is its critic export bit for bit; a run resumed from its step-2 checkpoint (policy
and critic) logs the uninterrupted run's step 3 to the last bit.
"""

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from rl.launch.convert import training_checkpoint_to_hf
from rl.trainer.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.parity import (
    BETAS,
    COMPARED,
    REFERENCE,
    assert_same_run,
    gradient_rtol,
    initial_weights,
    outlier_share,
    run_layout,
)
from tests.testing.tiny_job import make_tiny_job, run_train

EPOCHS = 2
CRITIC_LR = 1e-3
# a graded reward, so that the returns vary and the critic has something to learn
GAE = ("trainer.algorithm.advantage_estimator=gae", f"trainer.update_epochs_per_batch={EPOCHS}",
       f"trainer.critic.optimizer_config.lr={CRITIC_LR}", "data.reward_fn=tests.testing.parity:length_reward")
LAYOUTS = {
    "fsdp-2w": ("fsdp", 2, True, GAE),
    "deepspeed-2w-zero3": ("deepspeed", 2, True, (*GAE, "deepspeed_config.train.zero_optimization.stage=3")),
    "megatron-2w-tp2": ("megatron", 2, True, (*GAE, "trainer.policy.megatron_config.tensor_model_parallel_size=2")),
}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _run(run_dir, job, layout):
    """`run_layout` with the critic's export beside the policy's; PPO epochs double the optimizer steps."""
    run = run_layout(run_dir, job, layout)
    critic = load_file(os.path.join(run_dir, "exports", "critic", f"global_step_{max(run.steps)}",
                                    "model.safetensors"))
    return run._replace(optimizer_steps=run.optimizer_steps * EPOCHS), critic


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory):
    strategy, workers, packed, extra = REFERENCE
    return _run(str(tmp_path_factory.mktemp("reference")), job, (strategy, workers, packed, (*extra, *GAE)))


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_strategy_takes_the_reference_steps(job, reference, tmp_path, name):
    want, want_critic = reference
    got, got_critic = _run(str(tmp_path / "run"), job, LAYOUTS[name])
    assert all(row["vf_loss"] > 0 and "explained_variance" in row for row in want.steps.values())
    assert_same_run(want, got, job, name, compared=(*COMPARED, "vf_loss", "values_mean", "critic_grad_norm"))
    assert got_critic.keys() == want_critic.keys() and "score.weight" in want_critic
    # the critic's optimizer steps are the policy's (one mini-batch per epoch); bounds as for the policy's weights
    tolerances.assert_adam_runs_within(got_critic, want_critic, CRITIC_LR, want.optimizer_steps,
                                       gradient_rtol(job, want), outlier_share(job, want), BETAS,
                                       msg=f"{name} critic")


def test_warm_up_trains_the_critic_alone(job, tmp_path):
    run_dir = str(tmp_path / "run")
    overrides = [*job.overrides(steps=3), *GAE, "trainer.critic_warmup=2", "trainer.hf_save_interval=1",
                 "trainer.ckpt_interval=1"]
    result = run_train(run_dir, overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = {row["step"]: row for row in read_metrics(f"{run_dir}/metrics.jsonl") if "vf_loss" in row}
    assert sorted(rows) == [1, 2, 3]
    assert "pg_loss" not in rows[1] and "pg_loss" not in rows[2] and "pg_loss" in rows[3]
    start = initial_weights(job)
    for step in (1, 2):
        exported = load_file(os.path.join(run_dir, "exports", f"global_step_{step}", "model.safetensors"))
        for name, tensor in exported.items():
            assert torch.equal(tensor, start[name]), f"step {step}: the policy's {name} moved during the warm-up"
    last = load_file(os.path.join(run_dir, "exports", "global_step_3", "model.safetensors"))
    assert any(not torch.equal(tensor, start[name]) for name, tensor in last.items()), "step 3 trains the policy"
    converted = str(tmp_path / "critic")
    training_checkpoint_to_hf(f"{run_dir}/checkpoints/global_step_3", converted, None, None, model="critic")
    exported = load_file(os.path.join(run_dir, "exports", "critic", "global_step_3", "model.safetensors"))
    got = load_file(os.path.join(converted, "model.safetensors"))
    assert got.keys() == exported.keys() and all(torch.equal(got[n], t) for n, t in exported.items())
    resumed_dir = str(tmp_path / "resumed")
    shutil.copytree(f"{run_dir}/checkpoints/global_step_2", f"{resumed_dir}/checkpoints/global_step_2")
    result = run_train(resumed_dir, [*overrides, "trainer.resume_mode=latest"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    resumed = [row for row in read_metrics(f"{resumed_dir}/metrics.jsonl") if "vf_loss" in row]
    assert [row["step"] for row in resumed] == [3]
    for key in ("vf_loss", "values_mean", "critic_grad_norm", "explained_variance", "loss", "grad_norm"):
        assert resumed[0][key] == rows[3][key], key
