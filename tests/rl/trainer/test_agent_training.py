"""Agent training through the launcher: the example agent (`examples/agents/arith_agent.py`, the `openai` client
over HTTP on localhost) plays the embedded task over two turns through the endpoint for a few steps, generated
ahead of training (`trainer.fully_async`, staleness 1: each batch's episodes play in the rollout queue's thread while
the previous step trains): one trajectory per episode, sampled by a policy at most one update old, as many turns as
the agent's attempts, its rewards the training rewards; a bad agent is refused before anything starts, and the
console holds no line per HTTP call. (That it learns as `arith_retry` does is a measurement in the README, 40
steps, not a test here.)"""

import re

import pytest
import torch
import yaml

from rl.trainer.state.metrics import read_metrics
from tests.testing import tolerances
from tests.testing.launcher import launch_refused
from tests.testing.tiny_job import run_train

STEPS = 3
AGENT = ["environment.agent_fn=examples/agents/arith_agent.py:run", "generator.enable_http_endpoint=true",
         "generator.http_endpoint_port=0", "generator.max_turns=2"]
SERVED = "arith-policy"  # the name agents send as `model` (SkyRL's served_model_name); the example asks /v1/models


def _embedded_model() -> str:
    """The embedded default's checkpoint the run trained from (the launcher's verified cache entry)."""
    from rl.tasks.embedded import Recipe
    from rl.tasks.embedded.cache import EMBEDDED_FAMILY, default_cache_dir, entry_key

    return str(default_cache_dir() / EMBEDDED_FAMILY.name / entry_key(Recipe()))


def test_the_example_agent_trains_through_the_endpoint(tmp_path):
    run_dir = str(tmp_path / "run")
    asynchronous = ["trainer.placement.colocate_all=false", "trainer.fully_async.enabled=true",
                    "trainer.fully_async.max_staleness_steps=1"]
    # two mini-batches a step: the old logprobs get their own pass, so the gap between the tokens the engine
    # sampled (as the endpoint recorded them) and what the trainer scores is measured every step
    result = run_train(run_dir, [*AGENT, *asynchronous, f"generator.inference_engine.served_model_name={SERVED}",
                                 f"trainer.max_steps={STEPS}",
                                 "trainer.policy_mini_batch_size=8", f"trainer.eval_interval={STEPS}",
                                 "trainer.eval_before_train=false", "trainer.ckpt_interval=0"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert re.search(rf"^agent endpoint: http://127\.0\.0\.1:\d+/v1 serving '{SERVED}' ", result.stdout, re.M)
    assert "HTTP Request:" not in result.stdout + result.stderr, "the HTTP clients log every agent call"
    rows = read_metrics(f"{run_dir}/metrics.jsonl")
    with open(f"{run_dir}/config.yaml") as f:
        cfg = yaml.safe_load(f)
    episodes = cfg["trainer"]["train_batch_size"] * cfg["generator"]["n_samples_per_prompt"]
    # reward_mean and agent/solved: float32 means of `episodes` values in [0, 1], each within gamma_episodes of exact
    slack = 2 * tolerances.gamma(episodes, torch.float32)
    val = {r["step"]: r["val_accuracy"] for r in rows if "val_accuracy" in r}
    train = [r for r in rows if r["step"] >= 1]
    assert [row["step"] for row in train] == list(range(1, STEPS + 1))
    assert sorted(val) == [STEPS], val  # the evaluation's episodes through the agent, once
    lr = cfg["trainer"]["policy"]["optimizer_config"]["lr"]
    for row in train:
        # counts behind the means over trajectories (whole numbers; float means of small integers over ~128 are
        # exact): every endpoint call is one turn of one trajectory, every episode makes at least one trajectory
        trajectories = row["trajectories_per_episode"] * episodes
        calls = row["turns_mean"] * trajectories
        assert trajectories == int(trajectories) and calls == int(calls), row
        retries = calls - episodes  # second calls: the episodes whose first answer was wrong
        assert 0 < retries < episodes, row  # both paths ran: answers right at once, and questions asked again
        # a second call extends the first (the embedded chat template continues the conversation's tokens
        # exactly), so it adds no trajectory; only one whose reply the template cannot keep token for token (a
        # sampled special token the reply's text drops) starts one. Measured: 1 such call among ~280 retries in 3
        # steps; an agent whose calls never extended each other would start one per retry.
        assert episodes <= trajectories <= episodes + retries / 10, row
        if trajectories == episodes:  # then each trajectory is an episode: a turn per attempt
            assert row["turns_mean"] == row["agent/attempts"], row
        assert 0 <= row["policy_lag"] <= min(row["step"] - 1, 1)  # the engines' own versions: within the bound
        assert row["step"] - 1 - row["policy_lag"] <= row["policy_version"] <= row["step"] - 1
        assert row["reward_mean"] <= row["agent/solved"] + slack  # a second-attempt solve earns 0.5
        if row["policy_lag"] == 0:
            # the trainer scores the very tokens the engine sampled, under the same weights: the engine's logprobs
            # and the trainer's agree to float32 rounding (a re-tokenized reply would miss by whole nats); the
            # weights have had 2 Adam steps per step before
            bound = tolerances.trained_model_logprob_gap(_embedded_model(), lr, 2 * (row["step"] - 1))
            assert row["rollout_logprob_abs_diff_max"] <= bound, (row["step"], row["rollout_logprob_abs_diff_max"])
    assert any(row["policy_lag"] == 0 for row in train)


@pytest.mark.parametrize("overrides,message", [
    (["environment.agent_fn=examples/agents/arith_agent.py:nope", "generator.enable_http_endpoint=true"],
     "environment.agent_fn: examples/agents/arith_agent.py has no 'nope'"),
    (["environment.agent_fn=examples/agents/arith_agent.py:run"],
     "environment.agent_fn: plays its episodes through the OpenAI-compatible endpoint; set "
     "generator.enable_http_endpoint=true"),
    (["generator.enable_http_endpoint=true"], "generator.enable_http_endpoint: is true, but environment.agent_fn"),
    ([*AGENT, "generator.http_endpoint_host=0.0.0.0"],
     "generator.http_endpoint_host: is 0.0.0.0, which other machines can reach: give "
     "generator.http_endpoint_api_key_file"),
    ([*AGENT, "generator.http_endpoint_host=0.0.0.0", "generator.http_endpoint_api_key_file=/no/such/key"],
     "generator.http_endpoint_api_key_file: cannot read /no/such/key (No such file or directory)"),
])
def test_bad_agents_are_refused_before_anything_starts(tmp_path, capsys, overrides, message):
    printed = launch_refused(str(tmp_path / "run"), overrides, capsys)
    assert message in printed, printed
