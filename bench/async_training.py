"""Synchronous against asynchronous training on the embedded default, the engine and the training worker each on
one core of their own (`trainer.placement.colocate_all=false` pins them), in one run.

    PYTHONPATH=. python -m bench.async_training [--steps 40] [--modes sync,one-step-off,async2] [--colocated]
    PYTHONPATH=. python -m bench.async_training --long-tail [--steps 40] [--seeds 42,1,2]

Modes: `sync` (generation, then training, on the separate cores), `one-step-off` (trainer.fully_async with
max_staleness_steps=1: veRL's one-step off-policy) and `async2` (max_staleness_steps=2); `--colocated` adds the
default placement (HF engine in the driver) as a reference row. Each mode runs the whole job through the launcher
(same seed, same prompts, same number of samples). Reported: seconds per step over steps 2..N (step 1 includes
the first generation, which nothing overlaps), steps/s relative to `sync`, the mean time the trainer waited for
rollouts, the mean time of the logprob passes and the policy update, tokens per second, the mean policy lag of the
trained rollouts, and the final validation accuracy (greedy, the embedded task's held-out prompts).

`--long-tail` runs the long-tail variant of the task (`bench.long_tail`: one prompt in 16 has a response about 8x
the median) with `trainer.fully_async` (staleness 2, separate cores) once per seed and mode: `whole-calls` (a
weight push waits for the engine call in progress) and `partial` (`partial_rollout_tokens=32`: the call goes on
in segments, pushes land between them, and a segment generates only the responses still open); reported per
mode as the mean over the seeds, with the response lengths seen in training and the seeds' accuracies.
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


ASYNC2 = [*SEPARATE, "trainer.fully_async.enabled=true", "trainer.fully_async.max_staleness_steps=2"]
LONG_TAIL_MODES = {
    "whole-calls": ASYNC2,
    "partial": [*ASYNC2, "trainer.fully_async.partial_rollout_tokens=32"],
}


def run_mode(name: str, overrides: list[str], steps: int, root: str) -> dict:
    from rl.core.subprocess_run import run_train
    from rl.trainer.state.metrics import read_metrics

    run_dir = os.path.join(root, name)
    done = run_train(run_dir, [*overrides, f"trainer.max_steps={steps}"], threads=1, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    trained = [row for row in rows if "step_time_s" in row and row["step"] > 1]
    accuracy = [row["val_accuracy"] for row in rows if row["step"] == steps and "val_accuracy" in row]
    return {"step_s": statistics.mean(row["step_time_s"] for row in trained),
            "wait_s": statistics.mean(row["generate_time_s"] for row in trained),
            "push_s": statistics.mean(row["sync_time_s"] for row in trained),
            "lag": statistics.mean(row.get("policy_lag", 0.0) for row in trained),
            "train_s": statistics.mean(row["logprobs_time_s"] + row["update_time_s"] for row in trained),
            "tokens_per_s": statistics.mean(row["tokens_per_s"] for row in trained),
            "response_mean": statistics.mean(row["response_length_mean"] for row in trained),
            "response_max": max(row["response_length_max"] for row in trained),
            "partial": statistics.mean(row.get("partial_responses", 0.0) for row in trained),
            "accuracy": accuracy[0] if accuracy else float("nan")}


def long_tail(steps: int, seeds: list[int], workdir: str) -> int:
    from pathlib import Path

    from bench.long_tail import MAX_POSITIONS, prepare

    job = prepare(Path(workdir))
    data = [f"trainer.policy.model.path={job['model']}", f"data.train_data=[{job['train']}]",
            f"data.val_data=[{job['val']}]", "trainer.max_prompt_length=96",
            # the embedded job's own settings (rl/core/config/embedded_job.yaml), which apply only to its own model
            "trainer.policy.optimizer_config.lr=2e-4", "generator.n_samples_per_prompt=8",
            f"generator.max_generate_length={MAX_POSITIONS - 96}"]
    results: dict[str, list[dict]] = {name: [] for name in LONG_TAIL_MODES}
    with tempfile.TemporaryDirectory() as root:
        for seed in seeds:
            for name, overrides in LONG_TAIL_MODES.items():
                results[name].append(run_mode(f"{name}-{seed}", [*data, *overrides, f"trainer.seed={seed}"],
                                              steps, root))
                print(f"{name} seed {seed}: done", file=sys.stderr, flush=True)
    base = statistics.mean(r["step_s"] for r in results["whole-calls"])
    rows = []
    for name, runs in results.items():
        step_s = statistics.mean(r["step_s"] for r in runs)
        rows.append([name, step_s, 1 / step_s, base / step_s, statistics.mean(r["wait_s"] for r in runs),
                     statistics.mean(r["train_s"] for r in runs), statistics.mean(r["push_s"] for r in runs),
                     statistics.mean(r["response_mean"] for r in runs),
                     max(r["response_max"] for r in runs), statistics.mean(r["partial"] for r in runs),
                     statistics.mean(r["lag"] for r in runs), statistics.mean(r["accuracy"] for r in runs),
                     " ".join(f"{r['accuracy']:.3f}" for r in runs)])
    print(f"long-tail task, {steps} steps, seeds {','.join(map(str, seeds))}, trainer.fully_async staleness 2, "
          "CPU (engine and worker on one core each); means over the seeds")
    print(format_table(["mode", "s/step", "steps/s", "vs whole calls", "rollout wait s", "train s", "push s",
                        "response mean", "response max", "partial share", "policy lag", "val accuracy",
                        "per seed"], rows))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--modes", default="sync,one-step-off,async2")
    parser.add_argument("--colocated", action="store_true", help="add the default colocated placement")
    parser.add_argument("--long-tail", action="store_true", help="the long-tail scenario: whole calls vs partial")
    parser.add_argument("--seeds", default="42,1,2", help="--long-tail: the seeds of each mode")
    parser.add_argument("--workdir", default=os.path.expanduser("~/.cache/rlpost/bench-long-tail"),
                        help="--long-tail: where the task's data and model are built once")
    args = parser.parse_args(argv)
    if args.long_tail:
        return long_tail(args.steps, [int(seed) for seed in args.seeds.split(",")], args.workdir)
    names = (["colocated"] if args.colocated else []) + args.modes.split(",")
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for name in names:
            results[name] = run_mode(name, MODES[name], args.steps, root)
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
