"""Synchronous against asynchronous training on the embedded default, the engine and the training worker each on
one core of their own (`trainer.placement.colocate_all=false` pins them), in one run.

    PYTHONPATH=. python -m bench.async_training [--steps 40] [--modes sync,one-step-off,async2] [--colocated]

Modes: `sync` (generation, then training, on the separate cores), `one-step-off` (trainer.fully_async with
max_staleness_steps=1: veRL's one-step off-policy) and `async2` (max_staleness_steps=2); `--colocated` adds the
default placement (HF engine in the driver) as a reference row. Each mode runs the whole job through the launcher
(same seed, same prompts, same number of samples). Reported: seconds per step over steps 2..N (step 1 includes
the first generation, which nothing overlaps), steps/s relative to `sync`, the mean time the trainer waited for
rollouts, the mean time of the logprob passes and the policy update, tokens per second, the mean policy lag of the
trained rollouts, and the final validation accuracy (greedy, the embedded task's held-out prompts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from bench.common import format_table

SEPARATE = ["trainer.placement.colocate_all=false"]
MODES = {
    "colocated": [],
    "sync": SEPARATE,
    "one-step-off": [*SEPARATE, "trainer.fully_async.enabled=true", "trainer.fully_async.max_staleness_steps=1"],
    "async2": [*SEPARATE, "trainer.fully_async.enabled=true", "trainer.fully_async.max_staleness_steps=2"],
}


def run_mode(name: str, steps: int, root: str) -> dict:
    from rl.launch.subprocess_run import run_train
    from rl.trainer.metrics import read_metrics

    run_dir = os.path.join(root, name)
    done = run_train(run_dir, [*MODES[name], f"trainer.max_steps={steps}"], threads=1, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    trained = [row for row in rows if "step_time_s" in row and row["step"] > 1]
    accuracy = [row["val_accuracy"] for row in rows if row["step"] == steps and "val_accuracy" in row]
    return {"step_s": statistics.mean(row["step_time_s"] for row in trained),
            "wait_s": statistics.mean(row["generate_time_s"] for row in trained),
            "lag": statistics.mean(row.get("policy_lag", 0.0) for row in trained),
            "train_s": statistics.mean(row["logprobs_time_s"] + row["update_time_s"] for row in trained),
            "tokens_per_s": statistics.mean(row["tokens_per_s"] for row in trained),
            "accuracy": accuracy[0] if accuracy else float("nan")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--modes", default="sync,one-step-off,async2")
    parser.add_argument("--colocated", action="store_true", help="add the default colocated placement")
    args = parser.parse_args(argv)
    names = (["colocated"] if args.colocated else []) + args.modes.split(",")
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for name in names:
            results[name] = run_mode(name, args.steps, root)
            print(f"{name}: done", file=sys.stderr, flush=True)
    base = results.get("sync", next(iter(results.values())))["step_s"]
    rows = [[name, r["step_s"], 1 / r["step_s"], base / r["step_s"], r["wait_s"], r["train_s"], r["tokens_per_s"],
             r["lag"], r["accuracy"]] for name, r in results.items()]
    print(f"embedded default, {args.steps} steps, seed 42, CPU (engine and worker on one core each unless colocated)")
    print(format_table(["mode", "s/step", "steps/s", "vs sync", "rollout wait s", "train s", "tokens/s",
                        "policy lag", "val accuracy"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
