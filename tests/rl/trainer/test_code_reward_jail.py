"""`data.reward_fn=python_expression` through the launcher: the answers it evaluates run in the jail of
`rl.core.sandbox`, inside the reward processes, so a row whose answer tries to escape changes nothing on the host and
the run trains on; and where the jail cannot be built the run is refused before anything starts, naming why and the
key that opts out."""

import os
import secrets

import pandas as pd
import pytest

import rl.core.sandbox as sandbox
from rl.core.sandbox import Isolation, sandbox_problem
from rl.trainer.state.metrics import read_metrics
from tests.testing.launcher import launch_refused
from tests.testing.tiny_job import make_tiny_job, run_train

REFUSAL = "the jail needs bubblewrap (`bwrap`), which is not installed here"


def test_a_run_is_refused_where_the_jail_cannot_be_built(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sandbox, "isolation", lambda: Isolation(jail=REFUSAL))
    message = launch_refused(str(tmp_path / "run"), ["data.reward_fn=python_expression"], capsys)
    assert (f"data.reward_fn: python_expression runs the model's code in the jail, which this machine cannot give "
            f"every guarantee: {REFUSAL}. Fix that, or set environment.sandbox.allow_weaker_isolation=true, with "
            "which model-written code runs unconfined") in message, message


def test_with_the_opt_out_the_run_goes_on_saying_what_it_lost(monkeypatch, capsys):
    from rl.core.config.loader import load_config
    from rl.trainer.preflight.checks import _sandbox_problems

    monkeypatch.setattr(sandbox, "isolation", lambda: Isolation(seccomp="no filter for this CPU"))
    cfg = load_config(["data.reward_fn=python_expression", "environment.sandbox.allow_weaker_isolation=true"])
    assert _sandbox_problems(cfg) == []
    assert ("warning: environment.sandbox.allow_weaker_isolation=true: no filter for this CPU; model-written code "
            "runs in the jail without its seccomp filter") in capsys.readouterr().out
    assert _sandbox_problems(load_config(["data.reward_fn=gsm8k"])) == []  # no model code run: nothing asked


@pytest.mark.skipif(sandbox_problem() is not None, reason=f"no jail on this machine: {sandbox_problem()}")
def test_answers_that_try_to_escape_change_nothing_on_the_host(tmp_path):
    """Every answer is evaluated in the jail by the reward processes (and every response, against it): writes to
    the host's /tmp, /run/lock, the run directory and the test's folder, a read of the checkout and an umount."""
    job = make_tiny_job(str(tmp_path / "job"))
    run_dir, token = str(tmp_path / "run"), secrets.token_hex(6)
    targets = [f"/tmp/rl-launch-escape-{token}", f"/run/lock/rl-launch-escape-{token}", f"{run_dir}/escaped",
               str(tmp_path / "escaped")]
    checkout = os.path.realpath(__file__)
    answers = [*(f"(open({path!r}, 'w').write('x'), 1)[1]" for path in targets),
               f"(print(open({checkout!r}).read()), 1)[1]", "__import__('ctypes').CDLL(None).umount2(b'/tmp', 2)"]
    rows = pd.read_parquet(job.train_data)
    rows["answer"] = [answers[index % len(answers)] for index in range(len(rows))]
    rows.to_parquet(tmp_path / "escapes.parquet")
    overrides = [*job.overrides(steps=1), f"data.train_data=['{tmp_path / 'escapes.parquet'}']",
                 "data.reward_fn=python_expression"]
    result = run_train(run_dir, overrides)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    [row] = [r for r in read_metrics(f"{run_dir}/metrics.jsonl") if r["step"] >= 1]
    assert row["reward_errors"] == 0, row
    assert [path for path in targets if os.path.exists(path)] == []
