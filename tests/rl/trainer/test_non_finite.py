"""The finite-update guard (`trainer.non_finite`): non-finite rewards are caught before advantages and named, a
non-finite gradient norm is never applied by a backend, a non-finite loss or norm ends the run naming the step, and
no checkpoint is committed with non-finite weights; one launcher run of the tiny job (untied) with an environment
whose rewards turn NaN at step 2."""

import glob
import math
import os
import textwrap

import pytest
import torch

from rl.backends.base import ModelSpec, TrainingBackend, weights_finite
from rl.backends.dist import DistInfo
from rl.core.data.records import PromptRecord
from rl.trainer.state import checkpoint
from rl.trainer.state.finite import NonFiniteError, check_update, non_finite_rewards
from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train


class Rollout:
    def __init__(self, prompt_index: int):
        self.prompt_index = prompt_index


RECORDS = [PromptRecord(prompt="1+1", answer="2", data_source="arith", index=i, where=f"train.jsonl row {i + 1}")
           for i in range(2)]
ROLLOUTS = [Rollout(0), Rollout(0), Rollout(1), Rollout(1)]


def test_a_non_finite_reward_is_named_by_its_source_and_row():
    rewards = torch.tensor([1.0, 0.0, math.inf, math.nan])
    with pytest.raises(NonFiniteError, match=r"^environment.env_class my.py:Env gave reward inf on train.jsonl row 2 "
                                             r"\(2 non-finite reward\(s\) in this batch\); .*trainer.non_finite=skip"):
        non_finite_rewards(rewards, ROLLOUTS, RECORDS, "environment.env_class my.py:Env", "fail")
    assert non_finite_rewards(torch.ones(4), ROLLOUTS, RECORDS, "data.reward_fn", "fail") == 0


def test_skip_warns_and_counts(capsys):
    assert non_finite_rewards(torch.tensor([math.nan, 1.0, 1.0, 1.0]), ROLLOUTS, RECORDS, "data.reward_fn",
                              "skip") == 1
    assert "warning: data.reward_fn gave reward nan on train.jsonl row 1" in capsys.readouterr().out


@pytest.mark.parametrize("row", [{"loss": math.nan, "grad_norm": 1.0, "skipped_steps": 0.0},
                                 {"loss": 0.5, "grad_norm": math.inf, "skipped_steps": 1.0}])
def test_a_non_finite_loss_or_norm_ends_the_run_naming_the_step(row):
    with pytest.raises(NonFiniteError, match=r"^loss/grad norm at step 7 is not finite"):
        check_update(7, row, "fail")
    check_update(7, row, "skip")
    check_update(7, {"loss": 0.5, "grad_norm": 1.0, "skipped_steps": 0.0}, "fail")


class LinearBackend(TrainingBackend):
    """The shared optimizer step on one plain module (no process group)."""

    def build(self):
        self.model = torch.nn.Linear(3, 2)
        self.make_optimizer(self.model.parameters())

    def save_checkpoint(self, path):
        raise NotImplementedError

    def load_checkpoint(self, path):
        raise NotImplementedError

    @classmethod
    def checkpoint_weights(cls, path, model_path):
        raise NotImplementedError

    def full_state_dict(self):
        return self.model.state_dict()


def test_the_optimizer_step_drops_a_non_finite_gradient():
    backend = LinearBackend(ModelSpec(path="", role="policy", temperature=1.0, lr=0.1), DistInfo(0, 1,
                                                                                                  torch.device("cpu")))
    backend.build()
    before = [p.detach().clone() for p in backend.model.parameters()]
    backend.model(torch.tensor([[1.0, math.nan, 0.0]])).sum().backward()
    out = backend.optimizer_step()
    assert out["skipped_steps"] == 1.0 and not math.isfinite(out["grad_norm"])
    assert all(torch.equal(a, b) for a, b in zip(before, backend.model.parameters(), strict=True))
    assert all(p.grad is None for p in backend.model.parameters()) and backend.scheduler.last_epoch == 0
    backend.model(torch.ones(1, 3)).sum().backward()
    out = backend.optimizer_step()
    assert out["skipped_steps"] == 0.0 and math.isfinite(out["grad_norm"])
    assert not torch.equal(before[0], backend.model.weight) and backend.weights_finite()
    with torch.no_grad():
        backend.model.bias[0] = math.inf
    assert not backend.weights_finite() and weights_finite([torch.zeros(0)])


NAN_ENV = textwrap.dedent("""
    from rl.core.environments import Environment, StepResult

    STARTED = [0]

    class NanAfterFirstStep(Environment):
        '''Reward 1 in the first training step's 16 episodes, NaN from then on.'''

        def start(self, record):
            STARTED[0] += 1
            self.nan = STARTED[0] > 16

        def step(self, action):
            return StepResult(observation="", reward=float("nan") if self.nan else 1.0, done=True)
""")


def untie(model_path: str) -> None:
    """The tiny model with an LM head of its own (a NaN update then reaches a checkpoint, not the tied sync)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    model.save_pretrained(model_path, safe_serialization=True)


def test_a_nan_environment_ends_the_run_with_no_nan_checkpoint(tmp_path):
    job = make_tiny_job(str(tmp_path / "job"))
    untie(job.model_path)
    env_file = tmp_path / "nan_env.py"
    env_file.write_text(NAN_ENV)
    run_dir = str(tmp_path / "run")
    result = run_train(run_dir, [*job.overrides(steps=3), f"environment.env_class={env_file}:NanAfterFirstStep",
                                 "trainer.ckpt_interval=1"])
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-5000:]
    lines = [line for line in result.stderr.splitlines() if "gave reward nan" in line]
    assert len(lines) == 1, result.stderr[-3000:]
    assert f"environment.env_class {env_file}:NanAfterFirstStep gave reward nan on " in lines[0]
    assert "at step 2" in lines[0] and "checkpoint" in lines[0] and "trainer.non_finite=skip" in lines[0]
    assert "Traceback" not in result.stderr[-2000:]
    rows = [r for r in read_metrics(f"{run_dir}/metrics.jsonl") if r["step"] >= 1]
    assert [r["step"] for r in rows] == [1] and math.isfinite(rows[0]["grad_norm"])
    assert rows[0]["skipped_steps"] == 0.0
    root = os.path.join(run_dir, "checkpoints")
    complete = [p for p in sorted(glob.glob(os.path.join(root, "*"))) if checkpoint.is_complete(p)]
    assert len(complete) == 1 and checkpoint.latest(root) == complete[0]
    from rl.backends.registry import backend_class

    weights = backend_class("fsdp2").checkpoint_weights(complete[0], job.model_path)
    assert "lm_head.weight" in weights and all(bool(torch.isfinite(w).all()) for w in weights.values())
