"""A generation engine SIGKILLed in the middle of an asynchronous run, or stopped (SIGSTOP: it hangs, and
trainer.actor_call_timeout_s is 15 s): the launcher ends within 60 s with exit code 1 and one line naming the actor
(what it is, host, Ray node, pid), the step and the last complete checkpoint, which stays intact; no traceback. A
training worker's death is named by the same words (`run._actor_failure`): test_recovery kills one and checks them."""

import os
import re
import signal
import time

import pytest

from rl.core.subprocess_run import kill_group, start_train
from rl.trainer.state import checkpoint
from tests.testing.tiny_job import make_tiny_job, wait_for

RUN = ["trainer.placement.colocate_all=false", "trainer.fully_async.enabled=true",
       "trainer.placement.policy_num_gpus_per_node=2", "trainer.micro_train_batch_size_per_gpu=1",
       "trainer.micro_forward_batch_size_per_gpu=1", "trainer.ckpt_interval=1"]
ENGINE = r"generation engine 0 \(\S+ node \S+ pid {pid} \(cpu, CPU cores \[0\]\)\)"
CASES = {  # victim: (its pid in the log, signal, how the last line names it)
    "engine": (r"engine 0: \S+ node \S+ pid (\d+)", signal.SIGKILL, ENGINE + r" died \(.*\)"),
    # a stopped engine holds up whoever waits on it (rank 0 streaming weights to it): all of them are named
    "hung-engine": (r"engine 0: \S+ node \S+ pid (\d+)", signal.SIGSTOP,
                    r"(.*, )?" + ENGINE + r"(, .*)? did not answer within 15 s \(trainer\.actor_call_timeout_s\)"),
}


@pytest.mark.parametrize("victim", CASES)
def test_failed_actor_ends_the_run_naming_it(tmp_path, victim):
    pid_pattern, sig, named = CASES[victim]
    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    log = open(tmp_path / "launcher.log", "w+")  # noqa: SIM115  (read during the run, closed below)
    proc = start_train(run_dir, [*job.overrides(steps=300), *RUN, "trainer.actor_call_timeout_s=15"], output=log)
    try:
        root = os.path.join(run_dir, "checkpoints")
        wait_for(proc, lambda: os.path.isdir(checkpoint.step_dir(root, 1)), "the run did not reach step 1")
        log.seek(0)
        pid = int(re.search(pid_pattern, log.read()).group(1))
        os.kill(pid, sig)
        killed = time.monotonic()
        assert proc.wait(timeout=60) == 1
        assert time.monotonic() - killed < 60
        log.seek(0)
        output = log.read()
        errors = [line for line in output.splitlines() if line.startswith("error: ")]  # Ray's own warnings beside
        assert len(errors) == 1, output[-3000:]
        last = errors[0]
        assert re.fullmatch(rf"error: {named.format(pid=pid)} at step \d+; last complete "
                            rf"checkpoint: .*global_step_\d+ \(resume with trainer\.resume_mode=latest\)", last), last
        assert "Traceback" not in output
        saved = re.search(r"last complete checkpoint: (\S+)", last).group(1)
        assert checkpoint.verify(saved) == [] and checkpoint.is_complete(saved)
    finally:
        kill_group(proc.pid)
        log.close()


def test_an_engine_that_cannot_start_is_named_with_its_exception(tmp_path):
    """vLLM refuses an engine argument only in the engine actor's construction (a block size its CPU attention does
    not take): the last line names the actor, the exception's type and message, and the file holding the whole
    traceback (before, the cause was in Ray's worker logs only)."""
    from tests.testing.tiny_job import ENGINE_KV_CACHE, run_train

    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    result = run_train(run_dir, [*job.overrides(steps=1), "generator.backend=vllm", ENGINE_KV_CACHE,
                                 "generator.engine_init_kwargs={block_size: 7}"])
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    traceback = os.path.join(run_dir, "actor_failure.txt")
    assert re.fullmatch(r"error: a generation engine \(EngineActor, pid \d+\) died in its construction: "
                        r"ValueError: No common block size for 7\b.* \(traceback: " + re.escape(traceback) +
                        r"\) at step 0; no complete checkpoint yet", last), last
    with open(traceback, encoding="utf-8") as f:
        text = f.read()
    assert 'File "' in text and "ValueError: No common block size for 7" in text
