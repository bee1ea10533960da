"""PPO with a critic (`advantage_estimator=gae`) end to end through the real launcher: the same steps on every
strategy and placement, the critic's warm-up, and a LoRA critic.

Parity: DeepSpeed ZeRO-3 on 2 workers (the value head partitioned) and fsdp2 with the critic on 2 workers of its own
(`colocate_all=false`, the engine on a core of its own) run the steps of fsdp2 on one worker (two PPO epochs per
batch, a critic trained beside the policy): the same rewards, losses, value losses and gradient norms
up to summation order, and policy and critic exports within Adam's bounds of the reference's (`tests.testing.parity`).
The critic's lr is raised so that its weights move far beyond those bounds. fsdp's critic is its policy's backend
with a value head: its steps against the token-classifier oracle are tests/rl/backends/test_critic.py's, its two-rank
reductions the policy's in test_parity_minibatch. megatron's critic with TP=2 is the LoRA critic's run below (its
steps, its merged export of each TP shard) and tests/rl/backends/megatron/test_critic.py's (a full critic's values
and value loss against the oracle under TP=2).
Warm-up, with a LoRA critic on a group of its own: with `trainer.critic_warmup=2` the first two steps train the
critic only: no policy loss is logged and the exported policy is the starting model bit for bit. The same run's last
checkpoint (the critic's adapters and value head), converted with `rl.launch.convert --model=critic`, is its critic
export (merged) bit for bit; a run resumed from its step-2 checkpoint (the policy's part from the policy's workers,
the critic's from the critic's) logs the uninterrupted run's step 3 to the last bit; megatron with TP=2 takes the
same steps (value losses, values and gradient norms up to summation order).
"""

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from rl.launch.convert import training_checkpoint_to_hf
from rl.trainer.state.metrics import read_metrics
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
       f"trainer.critic.optimizer_config.lr={CRITIC_LR}", "data.reward_fn=tests.testing.graded_rewards:length_reward")
LAYOUTS = {
    "deepspeed-2w-zero3": ("deepspeed", 2, True, (*GAE, "deepspeed_config.train.zero_optimization.stage=3")),
    "fsdp2-critic-group-2w": ("fsdp2", 1, True, (*GAE, "trainer.placement.colocate_all=false",
                                                 "trainer.placement.critic_num_gpus_per_node=2")),
}
CRITIC_LORA = ("trainer.critic.model.lora.rank=4", "trainer.critic.model.lora.alpha=8",
               "trainer.critic.model.lora.target_modules=[q_proj,v_proj,down_proj]")
CRITIC_METRICS = ("vf_loss", "values_mean", "critic_grad_norm", "explained_variance")


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


def _warm_up_overrides(job) -> list[str]:
    """A LoRA critic on a group of its own (as many workers as the policy: colocate_all=false)."""
    return [*job.overrides(steps=3), *GAE, *CRITIC_LORA, "trainer.critic_warmup=2", "trainer.hf_save_interval=1",
            "trainer.ckpt_interval=1", "trainer.placement.colocate_all=false"]


def _critic_rows(run_dir: str) -> dict[int, dict]:
    return {row["step"]: row for row in read_metrics(f"{run_dir}/metrics.jsonl") if "vf_loss" in row}


@pytest.fixture(scope="module")
def warm_up(job, tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("warm_up"))
    result = run_train(run_dir, _warm_up_overrides(job))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "the critic on 1 worker(s) of its own (1 x 1)" in result.stdout
    return run_dir


def _converted_critic(run_dir: str, step: int, out: str) -> tuple[dict, dict]:
    """(the checkpoint's critic converted by `rl.launch.convert --model=critic`, the critic's export) of `step`."""
    training_checkpoint_to_hf(f"{run_dir}/checkpoints/global_step_{step}", out, None, None, model="critic")
    exported = load_file(os.path.join(run_dir, "exports", "critic", f"global_step_{step}", "model.safetensors"))
    return load_file(os.path.join(out, "model.safetensors")), exported


def test_warm_up_trains_the_critic_alone(job, warm_up, tmp_path):
    run_dir, overrides = warm_up, _warm_up_overrides(job)
    rows = _critic_rows(run_dir)
    assert sorted(rows) == [1, 2, 3]
    assert "pg_loss" not in rows[1] and "pg_loss" not in rows[2] and "pg_loss" in rows[3]
    start = initial_weights(job)
    for step in (1, 2):
        exported = load_file(os.path.join(run_dir, "exports", f"global_step_{step}", "model.safetensors"))
        for name, tensor in exported.items():
            assert torch.equal(tensor, start[name]), f"step {step}: the policy's {name} moved during the warm-up"
    last = load_file(os.path.join(run_dir, "exports", "global_step_3", "model.safetensors"))
    assert any(not torch.equal(tensor, start[name]) for name, tensor in last.items()), "step 3 trains the policy"
    got, exported = _converted_critic(run_dir, 3, str(tmp_path / "critic"))
    assert got.keys() == exported.keys() and all(torch.equal(got[n], t) for n, t in exported.items())
    # the LoRA critic trained its adapters (merged into the layers they target) and its head, nothing else
    first = load_file(os.path.join(run_dir, "exports", "critic", "global_step_1", "model.safetensors"))
    moved = {name for name, tensor in exported.items() if not torch.equal(tensor, first[name])}
    assert "score.weight" in moved and any("q_proj" in name for name in moved)
    assert all(name.startswith("score.") or name.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight"))
               for name in moved), sorted(moved)
    resumed_dir = str(tmp_path / "resumed")
    shutil.copytree(f"{run_dir}/checkpoints/global_step_2", f"{resumed_dir}/checkpoints/global_step_2")
    result = run_train(resumed_dir, [*overrides, "trainer.resume_mode=latest"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    resumed = list(_critic_rows(resumed_dir).values())
    assert [row["step"] for row in resumed] == [3]
    for key in (*CRITIC_METRICS, "loss", "grad_norm"):
        assert resumed[0][key] == rows[3][key], key


def test_a_lora_critic_under_megatron_takes_the_same_steps(job, warm_up, tmp_path):
    run_dir = str(tmp_path / "megatron")
    # colocated (the critic on the policy's workers, the engine in the driver): the placement changes no number
    result = run_train(run_dir, [*_warm_up_overrides(job), "trainer.strategy=megatron",
                                 "trainer.placement.policy_num_gpus_per_node=2",
                                 "trainer.policy.megatron_config.tensor_model_parallel_size=2",
                                 "trainer.placement.colocate_all=true"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    want, got = _critic_rows(warm_up), _critic_rows(run_dir)
    assert sorted(got) == sorted(want) == [1, 2, 3]
    for step in sorted(want):  # steps 2 and 3 see the critic the earlier steps trained
        assert got[step]["reward_mean"] == want[step]["reward_mean"]
        for key in (*CRITIC_METRICS, *(("loss", "grad_norm") if step == 3 else ())):
            assert got[step][key] == pytest.approx(want[step][key], rel=1e-4, abs=1e-6), f"step {step} {key}"
    # megatron's export merges each TP shard, the conversion the whole gathered adapters: float32 rounding apart
    converted, exported = _converted_critic(run_dir, 3, str(tmp_path / "critic"))
    assert converted.keys() == exported.keys()
    for name, tensor in exported.items():
        bound = 4 * tolerances.unit_roundoff(torch.float32) * (tensor.abs().max().item() + 1e-30)
        tolerances.assert_within(converted[name], tensor, bound, msg=name)
