"""Agent training through the launcher: the example agent (`examples/agents/arith_agent.py`, the `openai` client
over HTTP on localhost) plays the embedded task over two turns through the endpoint for a few steps, generated
ahead of training (`trainer.fully_async`, staleness 1: each batch's episodes play in the rollout queue's thread while
the previous step trains): one trajectory per episode, sampled by a policy at most one update old, as many turns as
the agent's attempts, its rewards the training rewards; a bad agent is refused before anything starts, and the
console holds no line per HTTP call. (That it learns as `arith_retry` does is a measurement in the README, 40
steps, not a test here.)"""

import pytest
import torch
import yaml

from rl.trainer.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.launcher import launch_refused
from tests.testing.tiny_job import run_train

STEPS = 3
AGENT = ["environment.agent_fn=examples/agents/arith_agent.py:run", "generator.enable_http_endpoint=true",
         "generator.http_endpoint_port=0", "generator.max_turns=2"]


def test_the_example_agent_trains_through_the_endpoint(tmp_path):
    run_dir = str(tmp_path / "run")
    asynchronous = ["trainer.placement.colocate_all=false", "trainer.fully_async.enabled=true",
                    "trainer.fully_async.max_staleness_steps=1"]
    result = run_train(run_dir, [*AGENT, *asynchronous, f"trainer.max_steps={STEPS}",
                                 f"trainer.eval_interval={STEPS}", "trainer.eval_before_train=false",
                                 "trainer.ckpt_interval=0"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "agent endpoint: http://127.0.0.1:" in result.stdout
    assert "HTTP Request:" not in result.stdout + result.stderr, "the HTTP clients log every agent call"
    rows = read_metrics(f"{run_dir}/metrics.jsonl")
    with open(f"{run_dir}/config.yaml") as f:
        cfg = yaml.safe_load(f)
    episodes = cfg["trainer"]["train_batch_size"] * cfg["generator"]["n_samples_per_prompt"]
    # reward_mean and agent/solved: float32 means of `episodes` values in [0, 1], each within gamma_episodes of exact
    slack = 2 * tolerances.gamma(episodes, torch.float32)
    val = {r["step"]: r["val_accuracy"] for r in rows if "val_accuracy" in r}
    train = [r for r in rows if r["step"] >= 1]
    assert sorted(val) == [STEPS] and 0.0 <= val[STEPS] <= 1.0, val  # the evaluation's episodes through the agent
    for row in train:
        # the agent's calls extend each other: one trajectory per episode unless the chat template cannot continue a
        # conversation's tokens exactly (then a second one, never more than one per turn), all by the step's policy
        assert 1.0 <= row["trajectories_per_episode"] <= 2.0
        assert 0 <= row["policy_lag"] <= min(row["step"] - 1, 1)  # the engines' own versions: within the bound
        assert row["step"] - 1 - row["policy_lag"] <= row["policy_version"] <= row["step"] - 1
        assert 1.0 <= row["agent/attempts"] <= 2.0 and 1.0 <= row["turns_mean"] <= 2.0
        if row["trajectories_per_episode"] == 1.0:  # a split episode's turns are counted per trajectory
            assert row["turns_mean"] == row["agent/attempts"]
        assert row["reward_mean"] <= row["agent/solved"] + slack  # a second-attempt solve earns 0.5
    assert [row["step"] for row in train] == list(range(1, STEPS + 1))


@pytest.mark.parametrize("overrides,message", [
    (["environment.agent_fn=examples/agents/arith_agent.py:nope", "generator.enable_http_endpoint=true"],
     "environment.agent_fn: examples/agents/arith_agent.py has no 'nope'"),
    (["environment.agent_fn=examples/agents/arith_agent.py:run"],
     "environment.agent_fn: plays its episodes through the OpenAI-compatible endpoint; set "
     "generator.enable_http_endpoint=true"),
    (["generator.enable_http_endpoint=true"], "generator.enable_http_endpoint: is true, but environment.agent_fn"),
])
def test_bad_agents_are_refused_before_anything_starts(tmp_path, capsys, overrides, message):
    printed = launch_refused(str(tmp_path / "run"), overrides, capsys)
    assert message in printed, printed
