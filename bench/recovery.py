"""How long a run takes to recover from the death of an actor (trainer.max_restarts), on the embedded default with
the engine and the training workers on cores of their own (`trainer.placement.colocate_all=false`, two workers)
and a checkpoint every step, in one run per case:

    PYTHONPATH=. python -m bench.recovery [--steps 6] [--kill-after 3] [--cases none,engine,worker,reward]

Each case SIGKILLs its victim: `engine` the generation engine as step `--kill-after` + 1's generation call reaches
it (RL_KILL_AT=engine_generate:<version>), `worker` training rank 1 and `reward` a reward process
(data.reward_num_workers=2, while idle) once step `--kill-after`'s checkpoint is written. Reported: the run's wall
time, its extra time over `none` (the uninterrupted run), the recovery time the run printed (the engine: from the
death found to the replacement loaded with the weights, its call issued again; a worker: from the death to every
actor loaded again from the checkpoint, the steps run again after it on top), and whether every step's metrics
(timings aside) equal the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from bench.common import format_table

RUN = ["trainer.placement.colocate_all=false", "trainer.placement.policy_num_gpus_per_node=2",
       "trainer.ckpt_interval=1", "trainer.max_restarts=1", "data.reward_num_workers=2"]
VICTIMS = {"worker": r"rank 1: \S+ node \S+ pid (\d+)"}
TIMINGS = re.compile(r"_time_s$|^tokens_per_s$|^restarts$|^engines_replaced$")


def reward_process(launcher_pid: int) -> int:
    """A reward process of the launcher (`python -m rl.trainer.rewards.reward_worker`, its child)."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    for line in out.splitlines()[1:]:
        pid, ppid, args = line.split(None, 2)
        if int(ppid) == launcher_pid and "rl.trainer.rewards.reward_worker" in args:
            return int(pid)
    raise RuntimeError("no reward process found under the launcher")


def run_case(case: str, steps: int, kill_after: int, root: str) -> dict:
    from rl.core.subprocess_run import kill_group, start_train
    from rl.trainer.state import checkpoint

    run_dir = os.path.join(root, case)
    log_path = os.path.join(root, f"{case}.log")
    started = time.monotonic()
    env = ({"RL_KILL_AT": f"engine_generate:{kill_after}", "RL_KILL_ONCE": os.path.join(root, "engine-killed")}
           if case == "engine" else None)
    with open(log_path, "w+") as log:
        proc = start_train(run_dir, [*RUN, f"trainer.max_steps={steps}"], output=log, env_extra=env)
        try:
            if case in VICTIMS or case == "reward":
                step_dir = checkpoint.step_dir(os.path.join(run_dir, "checkpoints"), kill_after)
                while not os.path.isdir(step_dir):
                    if proc.poll() is not None:
                        raise RuntimeError(f"{case}: the run ended before step {kill_after}")
                    time.sleep(0.2)
                log.seek(0)
                pid = (reward_process(proc.pid) if case == "reward"
                       else int(re.search(VICTIMS[case], log.read()).group(1)))
                os.kill(pid, signal.SIGKILL)
            code = proc.wait(timeout=3600)
        finally:
            kill_group(proc.pid)
        log.seek(0)
        output = log.read()
    if code:
        raise RuntimeError(f"{case} exited {code}:\n{output[-3000:]}")
    recovered = re.search(r"^recovered in (\d+\.\d) s|; replaced in (\d+\.\d) s", output, re.M)
    seconds = float(recovered.group(1) or recovered.group(2)) if recovered else None
    return {"wall_s": time.monotonic() - started, "recovery_s": seconds, "run_dir": run_dir}


def same_metrics(run_dir: str, reference: str) -> bool:
    from rl.trainer.state.metrics import read_metrics

    got = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    want = read_metrics(os.path.join(reference, "metrics.jsonl"))
    strip = lambda row: {k: v for k, v in row.items() if not TIMINGS.search(k)}  # noqa: E731
    return [strip(r) for r in got] == [strip(r) for r in want]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--kill-after", type=int, default=3)
    parser.add_argument("--cases", default="none,engine,worker,reward")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    if cases[0] != "none":
        cases.insert(0, "none")
    root = tempfile.mkdtemp(prefix="bench-recovery-")
    results = {case: run_case(case, args.steps, args.kill_after, root) for case in cases}
    base = results["none"]
    rows = []
    for case, result in results.items():
        recovery = "-" if result["recovery_s"] is None else f"{result['recovery_s']:.1f}"
        same = "yes" if same_metrics(result["run_dir"], base["run_dir"]) else "NO"
        rows.append([case, f"{result['wall_s']:.1f}", f"{result['wall_s'] - base['wall_s']:+.1f}", recovery, same])
    print(f"embedded default, {args.steps} steps, killed after step {args.kill_after}'s checkpoint (runs in {root})")
    print(format_table(["killed", "wall s", "vs none s", "recovery s", "same metrics"], rows))


if __name__ == "__main__":
    main(sys.argv[1:])
