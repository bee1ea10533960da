"""A run that loses an actor recovers inside itself (trainer.max_restarts): a generation engine SIGKILLed as step 2's
generation call reaches it is replaced on its own and the call issued again with its seeds; a training worker
SIGKILLed after step 2's checkpoint makes the run's actors start again from it. The run finishes every step with
the metrics of every step and the exported weights of a run never interrupted, bit for bit (rollouts depend only on
seeds, weights and prompts, and resuming is exact, on one thread per process). Past the limit (the default 0) the
run ends naming the actor, with a resumable checkpoint: `test_actor_faults.py`."""

from __future__ import annotations

import os
import re
import signal

import pytest
from safetensors.torch import load_file

from rl.core.subprocess_run import kill_group, start_train
from rl.trainer.state import checkpoint
from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train, wait_for

STEPS = 4  # the worker dies after step 2, with steps left to recover into
RUN = ["trainer.placement.colocate_all=false", "trainer.placement.policy_num_gpus_per_node=2",
       "trainer.micro_train_batch_size_per_gpu=1", "trainer.micro_forward_batch_size_per_gpu=1",
       "trainer.ckpt_interval=1", f"trainer.hf_save_interval={STEPS}", "trainer.actor_call_timeout_s=60"]
TIMINGS = re.compile(r"_time_s$|^tokens_per_s$|^restarts$|^engines_replaced$")  # what a recovery may change
VICTIMS = {"engine": r"engine 0: \S+ node \S+ pid (\d+)", "worker": r"rank 1: \S+ node \S+ pid (\d+)"}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _overrides(job, restarts: int) -> list[str]:
    return [*job.overrides(steps=STEPS), *RUN, f"trainer.max_restarts={restarts}"]


def _weights(run_dir: str) -> dict:
    export = os.path.join(run_dir, "exports", f"global_step_{STEPS}")
    return {name: tensor for file in sorted(os.listdir(export)) if file.endswith(".safetensors")
            for name, tensor in load_file(os.path.join(export, file)).items()}


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory) -> str:
    run_dir = str(tmp_path_factory.mktemp("reference"))
    result = run_train(run_dir, _overrides(job, 2), own_ray=True)
    assert result.returncode == 0, result.stderr[-5000:]
    return run_dir


def _last_pid(text: str, pattern: str) -> int:
    return int(re.findall(pattern, text)[-1])


def test_killed_actors_are_recovered_and_the_run_ends_as_if_uninterrupted(job, tmp_path, reference):
    """The engine dies as step 2's generation reaches it (its first call at policy version 1; RL_KILL_ONCE lets its
    replacement answer), then, once the run has checkpointed step 2, training worker rank 1: one of each kind of
    recovery (two allowed of each), one run."""
    run_dir, log_path = str(tmp_path / "run"), tmp_path / "launcher.log"
    root = os.path.join(run_dir, "checkpoints")
    log = open(log_path, "w+")  # noqa: SIM115  (read during the run, closed below)
    proc = start_train(run_dir, _overrides(job, 2), output=log,
                       env_extra={"RL_KILL_AT": "engine_generate:1", "RL_KILL_ONCE": str(tmp_path / "engine-killed")})
    try:
        wait_for(proc, lambda: os.path.isdir(checkpoint.step_dir(root, 2)), "the run did not reach step 2", poll_s=0.2)
        worker = _last_pid(log_path.read_text(), VICTIMS["worker"])
        os.kill(worker, signal.SIGKILL)
        code = proc.wait(timeout=300)
        output = log_path.read_text()
    finally:
        kill_group(proc.pid)
        log.close()
    assert code == 0, output[-4000:]
    engine = _last_pid(output.split("generation engine 0 (", 1)[0], VICTIMS["engine"])  # the first engine's pid
    warnings = [line for line in output.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, warnings
    place = r"\S+ node \S+ pid {} \(cpu, CPU cores \[\d+\]\)"
    lost, new = place.format(engine), place.format(r"(\d+)")
    replaced = re.fullmatch(
        rf"warning: generation engine 0 \({lost}\) died \(ActorDiedError: .*\) at step 2; replaced in \d+\.\d s by "
        rf"generation engine 0 \({new}\); 1 call\(s\) issued again with their seeds \(1 of 2 recoveries from a lost "
        r"generation engine \(trainer\.max_restarts\)\)", warnings[0])
    assert replaced and int(replaced.group(1)) != engine, warnings[0]
    recovery = re.escape("1 of 2 recoveries from a lost training worker, critic, reference or reward model "
                         "(trainer.max_restarts)")
    assert re.fullmatch(rf"warning: training worker rank 1 \(\S+ node \S+ pid {worker}\) died \(.*\) at step \d; the "
                        rf"run's actors start again from .*global_step_2 \({recovery}\)", warnings[1]), warnings
    assert re.search(rf"^recovered in \d+\.\d s \({recovery}\)$", output, re.M), output[-3000:]
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    want = {row["step"]: row for row in read_metrics(os.path.join(reference, "metrics.jsonl"))}
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1)), "each step once, in order"
    for row in rows:
        compared = {key for key in want[row["step"]] if not TIMINGS.search(key)}
        assert {"loss", "grad_norm", "reward_mean", "kl"} <= compared and row.keys() == want[row["step"]].keys()
        assert {key: row[key] for key in compared} == {key: want[row["step"]][key] for key in compared}, row["step"]
    assert (rows[-1]["restarts"], rows[-1]["engines_replaced"]) == (1, 1)
    assert (want[STEPS]["restarts"], want[STEPS]["engines_replaced"]) == (0, 0)
    got, expected = _weights(run_dir), _weights(reference)
    assert got.keys() == expected.keys()
    assert all(got[name].equal(expected[name]) for name in expected), "the exported weights differ"
