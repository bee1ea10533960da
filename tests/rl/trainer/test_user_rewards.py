"""Rewards from the user's own code: the reward pool (processes, deadlines, dead workers), weighted sums, the two
`data.reward_on_error` policies, refusals before anything starts, and a tiny job trained through the launcher on a
reward read from a file."""

import math
import os
import signal
import textwrap
import time

import pytest

from rl.core.data.records import PromptRecord
from rl.trainer.rewards.rewarding import RewardError, RewardScorer
from rl.trainer.state.metrics import read_metrics
from tests.testing.launcher import launch_refused
from tests.testing.tiny_job import make_tiny_job, run_train
from tests.testing.tolerances import weighted_mean_gap

REWARDS = textwrap.dedent("""
    import math
    import os
    import sys
    import signal
    import time

    def exact(response, answer):
        return {"score": float(response.strip() == answer), "length": len(response)}

    def longer(response, answer, bonus=0.0):
        return len(response) / 10 + bonus

    def by_level(response, answer, level):
        return level * (response == answer)

    def raises(response, answer):
        if response == "bad":
            raise ValueError("cannot grade " + response)
        return 1.0

    def hangs(response, answer):
        if response == "slow":
            time.sleep(60)
        return 0.5

    def nan(response, answer):
        return math.nan if response == "bad" else 1.0

    def dies(response, answer):  # a crash: the process is killed, it does not choose to end
        if response == "bad":
            os.kill(os.getpid(), signal.SIGKILL)
        return 1.0

    def dies_once(response, answer):  # killed the first time it sees "bad" in this run, scored the second
        mark = os.path.join(os.environ["REWARD_TEST_MARKS"], response)
        if response == "bad" and not os.path.exists(mark):
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return 0.25

    def os_exits(response, answer):
        if response == "bad":
            os._exit(3)
        return 1.0

    def os_exits_caught(response, answer):  # the refusal caught: the call still ends the run
        if response == "bad":
            try:
                os._exit(0)
            except Exception:
                pass
        return 1.0

    def text(response, answer):
        return "1.0"

    def one_argument(response):
        return 0.0

    def exits(response, answer):
        if response == "bad":
            sys.exit(0)
        return 1.0

    def interrupts(response, answer):
        if response == "bad":
            raise KeyboardInterrupt
        return 1.0

    async def coroutine(response, answer):
        return 1.0

    def hashes(response, answer):
        # the tiny job's answers carry a '####' marker: reward each one, so the random policy gets signal early
        return float("####" in response) + float(response.strip().endswith(answer))
""")


def _data(**columns):
    return dict(reward_fn=columns.pop("reward_fn"), reward_weights=columns.pop("reward_weights", None),
                reward_num_workers=columns.pop("reward_num_workers", 2), reward_timeout_s=columns.pop("timeout", 2.0),
                reward_on_error=columns.pop("on_error", "zero"))


class _Cfg:
    def __init__(self, **kw):
        self.__dict__.update(_data(**kw))


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "my_rewards.py"
    path.write_text(REWARDS)
    return str(path)


def _records(n, level=2):
    return [PromptRecord(prompt=f"q{i}", answer="42", data_source="unit", index=i, fields={"level": level},
                         where=f"train.parquet row {i}") for i in range(n)]


def test_weighted_functions_sum_as_documented_and_log_their_own_metrics(reward_file):
    scorer = RewardScorer(_Cfg(reward_fn=[f"{reward_file}:exact", f"{reward_file}:longer",
                                          f"{reward_file}:by_level"], reward_weights=[0.5, 2.0, -1.0]))
    try:
        responses = ["42", "41 ", "forty-two"]
        rewards, metrics = scorer.score(responses, _records(3, level=3))
    finally:
        scorer.close()
    # by hand: 0.5 * exact + 2 * len / 10 - 3 * (response == "42")
    assert rewards.tolist() == pytest.approx([0.5 + 0.4 - 3.0, 0.0 + 0.6, 0.0 + 1.8])
    assert metrics["reward/exact"] == pytest.approx(1 / 3)
    assert metrics["reward/exact/length"] == pytest.approx((2 + 3 + 9) / 3)
    assert metrics["reward/longer"] == pytest.approx((0.2 + 0.3 + 0.9) / 3)
    assert metrics["reward_errors"] == 0


@pytest.mark.parametrize("workers", [2, 0])
def test_failures_score_zero_are_counted_and_named(reward_file, workers, capsys):
    bad = ["raises", "nan"] + (["dies"] if workers else [])
    scorer = RewardScorer(_Cfg(reward_fn=[f"{reward_file}:{name}" for name in bad], reward_num_workers=workers,
                               timeout=None if workers == 0 else 5.0))
    try:
        rewards, metrics = scorer.score(["good", "bad", "good"], _records(3))
        again, _ = scorer.score(["good"], _records(1))  # a replaced worker serves the next call
    finally:
        scorer.close()
    # row 1 fails in raises, nan, dies (0 each)
    per_good = 1.0 + 1.0 + (1.0 if workers else 0.0)
    assert rewards.tolist() == [per_good, 0.0, per_good]
    assert again.tolist() == [per_good]
    assert metrics["reward_errors"] == len(bad)
    printed = capsys.readouterr().out
    assert "raises failed on train.parquet row 1: ValueError: cannot grade bad" in printed


def test_a_row_that_kills_its_process_once_is_scored_again_on_a_fresh_one(reward_file, tmp_path, monkeypatch):
    monkeypatch.setenv("REWARD_TEST_MARKS", str(tmp_path))
    scorer = RewardScorer(_Cfg(reward_fn=f"{reward_file}:dies_once", on_error="fail", reward_num_workers=2,
                               timeout=30.0))
    try:
        rewards, metrics = scorer.score(["good", "bad", "good"], _records(3))
    finally:
        scorer.close()
    assert rewards.tolist() == [0.25, 0.25, 0.25] and metrics["reward_errors"] == 0
    assert (tmp_path / "bad").exists(), "the row never killed its process: nothing was retried"


def test_a_reward_process_killed_between_calls_is_replaced(reward_file):
    """Killed while idle (the kernel's OOM killer picks any process): the next call goes to a fresh one."""
    scorer = RewardScorer(_Cfg(reward_fn=f"{reward_file}:raises", on_error="fail", reward_num_workers=1, timeout=30.0))
    try:
        first, _ = scorer.score(["good"], _records(1))
        victim = scorer.pool.workers[0].process
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        again, metrics = scorer.score(["good", "good"], _records(2))
    finally:
        scorer.close()
    assert first.tolist() == [1.0] and again.tolist() == [1.0, 1.0] and metrics["reward_errors"] == 0


def test_a_function_that_fails_on_the_whole_batch_stops_the_run(reward_file):
    """data.reward_on_error=zero goes on past failed calls, not past a function that never works (`text` returns a
    string: every row fails), which would train on zeros."""
    scorer = RewardScorer(_Cfg(reward_fn=[f"{reward_file}:raises", f"{reward_file}:text"], reward_num_workers=0))
    try:
        with pytest.raises(RewardError) as error:
            scorer.score(["good", "bad", "good"], _records(3))
    finally:
        scorer.close()
    assert str(error.value).startswith(f"data.reward_fn: {reward_file}:text failed on all 3 responses of this batch, "
                                       "the first on train.parquet row 0: ")


def test_a_hung_call_is_killed_at_its_deadline_and_the_others_go_on(reward_file):
    scorer = RewardScorer(_Cfg(reward_fn=f"{reward_file}:hangs", timeout=1.0))
    try:
        started = time.perf_counter()
        rewards, metrics = scorer.score(["slow", "fast", "fast", "slow", "fast"], _records(5))
        took = time.perf_counter() - started
        again, _ = scorer.score(["fast", "fast"], _records(2))
    finally:
        scorer.close()
    assert rewards.tolist() == [0.0, 0.5, 0.5, 0.0, 0.5]
    assert again.tolist() == [0.5, 0.5]
    assert metrics["reward_errors"] == 2
    assert took < 15, "the two hung calls ran side by side and were cut at 1 s"


@pytest.mark.parametrize("name,why", [("raises", "ValueError: cannot grade bad"),
                                       ("nan", "its score is nan, not a finite number"),
                                       ("dies", "the reward process died mid-call twice (signal 9), on a fresh "
                                                "process the second time")])
def test_on_error_fail_names_the_function_and_row(reward_file, name, why):
    scorer = RewardScorer(_Cfg(reward_fn=f"{reward_file}:{name}", on_error="fail"))
    try:
        with pytest.raises(RewardError) as error:
            scorer.score(["good", "good", "bad"], _records(3))
    finally:
        scorer.close()
    assert f"{reward_file}:{name} failed on train.parquet row 2: {why}" in str(error.value)
    assert "data.reward_on_error=zero" in str(error.value)


@pytest.mark.parametrize("name,why", [("exits", "it called sys.exit(0) (SystemExit)"),
                                      ("interrupts", "it raised KeyboardInterrupt"),
                                      ("os_exits", "it called os._exit(3)"),
                                      ("os_exits_caught", "it called os._exit(0)")])
@pytest.mark.parametrize("workers", [0, 1])
def test_a_reward_that_tries_to_exit_ends_the_run_naming_it(reward_file, name, why, workers):
    """Whatever data.reward_on_error says, in the driver or in a reward process."""
    scorer = RewardScorer(_Cfg(reward_fn=f"{reward_file}:{name}", on_error="zero", reward_num_workers=workers,
                               timeout=None if workers == 0 else 5.0))
    try:
        with pytest.raises(RewardError) as error:
            scorer.score(["good", "bad"], _records(2))
    finally:
        scorer.close()
    assert str(error.value) == (f"data.reward_fn: {reward_file}:{name} on train.parquet row 1: {why}; user code "
                                "may not end the run, raise an exception instead")


def test_a_missing_row_field_is_named(reward_file):
    scorer = RewardScorer(_Cfg(reward_fn=f"{reward_file}:by_level", on_error="fail"))
    records = [PromptRecord(prompt="q", answer="1", data_source="unit", index=0, where="a.jsonl line 1")]
    try:
        with pytest.raises(RewardError, match=r"a\.jsonl line 1: .*row field.* level"):
            scorer.score(["1"], records)
    finally:
        scorer.close()


@pytest.mark.parametrize("reference,message", [
    ("{file}:missing", "has no 'missing'; it defines:"),
    ("{file}:one_argument", "has the signature one_argument(response)"),
    ("{dir}/absent.py:f", "absent.py does not exist"),
    ("no_such_package.rewards:f", "no module named 'no_such_package.rewards'"),
    ("gsm8", "Did you mean 'gsm8k'?"),
    ("{file}:coroutine", "is an async function; reward functions are called synchronously"),
])
def test_bad_references_are_refused_before_anything_starts(reward_file, tmp_path, capsys, reference, message):
    reference = reference.format(file=reward_file, dir=os.path.dirname(reward_file))
    printed = launch_refused(str(tmp_path / "run"), [f"data.reward_fn={reference}"], capsys)
    assert "data.reward_fn" in printed and message in printed, printed


def test_a_module_that_fails_to_import_is_refused(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("import math\nraise RuntimeError('needs a GPU sandbox')\n")
    printed = launch_refused(str(tmp_path / "run"), [f"data.reward_fn=['gsm8k', '{broken}:f']"], capsys)
    assert "data.reward_fn[1]: importing" in printed and "RuntimeError: needs a GPU sandbox" in printed, printed


def test_a_reward_from_a_user_file_trains_the_tiny_job(reward_file, tmp_path):
    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    result = run_train(run_dir, [*job.overrides(steps=2), f"data.reward_fn=['{reward_file}:hashes', 'gsm8k']",
                                 "data.reward_weights=[0.25, 1.0]"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = [r for r in read_metrics(f"{run_dir}/metrics.jsonl") if r["step"] >= 1]
    assert len(rows) == 2
    for row in rows:
        # both sources score >= 0, so their logged means are the magnitudes; 4 prompts x 4 samples a step
        gap = weighted_mean_gap([0.25, 1.0], [row["reward/hashes"], row["reward/gsm8k"]], samples=16)
        assert abs(row["reward_mean"] - (0.25 * row["reward/hashes"] + row["reward/gsm8k"])) <= gap, row
        assert row["reward_errors"] == 0 and math.isfinite(row["pg_loss"])


def test_a_failing_reward_ends_the_run_naming_it(reward_file, tmp_path):
    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    failing = tmp_path / "failing.py"
    failing.write_text("def grade(response, answer):\n    raise KeyError('no grader for ' + answer)\n")
    result = run_train(run_dir, [*job.overrides(steps=1), f"data.reward_fn={failing}:grade"])
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-5000:]
    assert f"data.reward_fn: {failing}:grade failed on " in result.stderr
    assert "KeyError: 'no grader for" in result.stderr and "at step 1" in result.stderr
    assert "Traceback" not in result.stderr[-2000:]


@pytest.mark.parametrize("statement,why", [("sys.exit(0)", "it called sys.exit(0) (SystemExit)"),
                                           ("raise KeyboardInterrupt", "it raised KeyboardInterrupt")])
def test_a_module_that_exits_on_import_is_refused(tmp_path, capsys, statement, why):
    exits = tmp_path / "exits.py"
    exits.write_text(f"import sys\n{statement}\n")
    printed = launch_refused(str(tmp_path / "run"), [f"data.reward_fn={exits}:f"], capsys)
    assert f"data.reward_fn: importing {exits} failed: {why}; user code may not end the run" in printed, printed
