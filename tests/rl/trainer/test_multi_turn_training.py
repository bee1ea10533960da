"""Multi-turn training through the launcher: the embedded default in the `arith_retry` environment (a second
attempt after a wrong answer) learns, the episodes' metrics are logged, and a bad environment is refused before
anything starts."""

import pytest

from rl.trainer.state.metrics import read_metrics
from tests.testing.launcher import launch_refused
from tests.testing.tiny_job import run_train

STEPS = 12


def test_the_embedded_default_learns_in_the_retry_environment(tmp_path):
    run_dir = str(tmp_path / "run")
    result = run_train(run_dir, ["environment.env_class=arith_retry", "generator.max_turns=2",
                                 f"trainer.max_steps={STEPS}", f"trainer.eval_interval={STEPS}",
                                 "trainer.ckpt_interval=0"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(f"{run_dir}/metrics.jsonl")
    val = {r["step"]: r["val_accuracy"] for r in rows if "val_accuracy" in r}
    train = [r for r in rows if r["step"] >= 1]
    assert val[STEPS] > val[0] + 0.3, val  # measured with one thread: 0.1975 -> 0.595 at step 12 (seed 42)
    first = train[0]
    assert 1.0 < first["turns_mean"] <= 2.0 and first["env/attempts"] == first["turns_mean"]
    assert first["reward_mean"] <= first["env/solved"] + 1e-6  # a second-attempt solve earns 0.5, a first one 1
    assert train[-1]["env/solved"] > first["env/solved"]


@pytest.mark.parametrize("overrides,message", [
    (["environment.env_class=arith_retyr"], "Did you mean 'arith_retry'?"),
    (["environment.env_class=arith_retry", "environment.env_options={tries: 3}"],
     "environment.env_options: arith_retry does not take {'tries': 3}"),
    (["generator.max_turns=3"], "without environment.env_class nothing answers the policy"),
])
def test_bad_environments_are_refused_before_anything_starts(tmp_path, capsys, overrides, message):
    printed = launch_refused(str(tmp_path / "run"), overrides, capsys)
    assert message in printed, printed
