"""What `trainer.exact_on_policy` costs and what it keeps, on the embedded default (the HF engine in the driver,
CPU), one launcher run with it off and one with it on:

    PYTHONPATH=. python -m bench.exact_on_policy [--steps 40] [--workers 2]

Reported per run: the mean step time and its parts (generation, the logprob passes, the update) over the steps after
the first, the trainer-vs-engine logprob gap the run measured (off: `rollout_logprob_abs_diff_mean`, the update's
forward against the engine's, since the run skips its old-logprob pass; on: `exact_logprob_gap`, the first
mini-batch's training forward against the engine's; each a token mean, whose largest step is shown), and the last
validation accuracy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from bench.common import format_table

PARTS = ("step_time_s", "generate_time_s", "logprobs_time_s", "update_time_s")


def run(run_dir: str, steps: int, workers: int, exact: bool) -> dict:
    from rl.core.subprocess_run import kill_group, start_train
    from rl.trainer.state.metrics import read_metrics

    overrides = [f"trainer.max_steps={steps}", f"trainer.placement.policy_num_gpus_per_node={workers}",
                 f"trainer.exact_on_policy={str(exact).lower()}"]
    started = time.monotonic()
    with open(run_dir + ".log", "w") as log:
        proc = start_train(run_dir, overrides, output=log)
        try:
            code = proc.wait(timeout=7200)
        finally:
            kill_group(proc.pid)
    if code:
        raise RuntimeError(f"exact_on_policy={exact} exited {code}; see {run_dir}.log")
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    later = rows[1:] or rows
    gap_key = "exact_logprob_gap" if exact else "rollout_logprob_abs_diff_mean"
    gaps = [row[gap_key] for row in rows if gap_key in row]
    accuracy = [row["val_accuracy"] for row in rows if "val_accuracy" in row]
    return {"wall_s": time.monotonic() - started, **{part: statistics.mean(r[part] for r in later) for part in PARTS},
            "gap": max(gaps) if gaps else float("nan"), "accuracy": accuracy[-1] if accuracy else float("nan")}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench-exact-")
    results = {exact: run(os.path.join(root, f"exact-{exact}"), args.steps, args.workers, exact)
               for exact in (False, True)}
    base = results[False]
    rows = [["on" if exact else "off", *(f"{r[part]:.2f}" for part in PARTS),
             f"{r['step_time_s'] / base['step_time_s']:.2f}x", f"{r['gap']:.3g}", f"{r['accuracy']:.3f}"]
            for exact, r in results.items()]
    print(f"embedded default, {args.steps} steps, {args.workers} workers, CPU (runs in {root})")
    print(format_table(["exact_on_policy", "step s", "generate s", "logprobs s", "update s", "step vs off",
                        "largest gap", "val accuracy"], rows))


if __name__ == "__main__":
    main(sys.argv[1:])
