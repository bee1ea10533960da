"""One GRPO job through every training strategy: seconds per step, training seconds per step and tokens per second.

    bazel run //bench:strategies -- [--strategies=fsdp2,fsdp,deepspeed,megatron] [--workers=1] [--steps=4] ...
    python -m bench.strategies --help

The same job runs once per strategy (and per round) through the real launcher (`python -m rl.launch.train` in a
subprocess, one Ray worker process per `--workers` on CPU, `trainer.placement.policy_num_gpus_per_node`), changing
only `trainer.strategy`: the embedded tokenizer and a randomly initialised Llama from `rl.tasks.embedded` (no
downloads), the synthetic arithmetic task, `--prompts_per_step` prompts x `--num_generations` samples per step,
completions of at most `--max_generate_length` tokens, lr 1e-3, one mini-batch, micro-batches of 2 sequences,
evaluation and checkpoints off, one seed for weights, data and sampling. As in the trainer parity tests, the reward
is `gsm8k_flexible` and the entropy bonus is on, so that the untrained model's first step already has a non-zero
loss and gradient (with the strict reward every advantage, and so the loss, is zero).

Each run's metrics.jsonl gives per step `step_time_s`, `tokens_per_s` and `generate_time_s`. The first step is a
warm-up and is not counted; the table shows medians over the counted steps of every round:

- s/step: the whole step (generation, rewards, logprobs, the update, the weight sync to the generator);
- train s/step: step minus generation. Generation is the same HF engine on the driver for every strategy, so this
  is the part the strategy changes;
- tokens/s and its ratio to fsdp2 (or to the first strategy measured when fsdp2 is not);
- step-1 loss: the warm-up step's loss, equal up to floating-point order when the strategies ran the same job.

Strategies alternate within each round (`--rounds`). A run that fails prints the tail of its output and is marked
failed in the table; the others still run.

Extra `key=value` arguments are forwarded to every run after the benchmark's own (so they win), e.g. a real model
and data on a GPU machine. `STRATEGY:key=value` forwards one only to that strategy's runs, for a backend's own
knobs, which the config refuses under another strategy (`megatron:trainer.policy.megatron_config.
tensor_model_parallel_size=2`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from bench.common import format_table, median

DEFAULT_STRATEGIES = "fsdp2,fsdp,deepspeed,megatron"
BASELINE = "fsdp2"


@dataclass
class Outcome:
    """What the runs of one strategy gave: counted steps of every round, the first run's step-1 loss, failures."""

    steps: list[dict] = field(default_factory=list)
    first_loss: float | None = None
    failures: list[str] = field(default_factory=list)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from rl.backends.registry import STRATEGIES

    names = STRATEGIES.names()

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--strategies", default=DEFAULT_STRATEGIES, help=f"comma-separated subset of {', '.join(names)}"
    )
    parser.add_argument("--workers", type=int, default=1, help="training workers (processes on CPU, GPUs on GPU)")
    parser.add_argument("--steps", type=int, default=4, help="steps per run, the first of them a warm-up (>= 2)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each strategy, alternating")
    parser.add_argument("--prompts_per_step", type=int, default=4, help="prompts per step (one mini-batch)")
    parser.add_argument("--num_generations", type=int, default=4, help="samples per prompt (group size)")
    parser.add_argument("--max_generate_length", type=int, default=12, help="most new tokens per sample")
    parser.add_argument("--model_size", default="tiny", help="rl.tasks.embedded model size: tiny, small or 0.5b "
                        "(Qwen2.5-0.5B's layers)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, the data and the run")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds before a run is stopped and marked failed")
    parser.add_argument(
        "overrides", nargs="*", metavar="[STRATEGY:]key=value", help="config overrides forwarded to the runs"
    )
    args = parser.parse_args(argv)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategies if s not in names]
    if unknown or not args.strategies:
        parser.error(f"--strategies: unknown {', '.join(unknown) or '(none given)'}; choose from {names}")
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is a warm-up and is not counted")
    if min(args.workers, args.rounds, args.prompts_per_step, args.num_generations, args.max_generate_length) < 1:
        parser.error("--workers, --rounds, --prompts_per_step, --num_generations, --max_generate_length must be >= 1")
    bad = [o for o in args.overrides if "=" not in o or split_forwarded(o)[0] not in (None, *names)]
    if bad:
        parser.error(f"extra arguments must be key=value or STRATEGY:key=value config overrides, got {bad}")
    return args


# --- the job ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    model_path: str
    train_data: str
    val_data: str


def make_job(directory: str, args: argparse.Namespace) -> Job:
    """The embedded tokenizer, a random `--model_size` Llama and the synthetic task, written under `directory`."""
    from rl.tasks.embedded import write_untrained_job

    rows = max(64, args.prompts_per_step * args.steps)
    job = write_untrained_job(directory, args.seed, n_train=rows, model_size=args.model_size)
    return Job(model_path=str(job.model_path), train_data=str(job.train_data), val_data=str(job.val_data))


def overrides_for(args: argparse.Namespace, job: Job, strategy: str) -> list[str]:
    """The job's overrides for one strategy, then the forwarded ones (all, and those prefixed `strategy:`)."""
    own = [
        f"trainer.policy.model.path={job.model_path}",
        f"data.train_data=['{job.train_data}']",
        f"data.val_data=['{job.val_data}']",
        f"trainer.strategy={strategy}",
        f"trainer.placement.policy_num_gpus_per_node={args.workers}",
        f"trainer.max_steps={args.steps}",
        f"trainer.train_batch_size={args.prompts_per_step}",
        f"trainer.policy_mini_batch_size={args.prompts_per_step}",
        "trainer.micro_train_batch_size_per_gpu=2",
        "trainer.micro_forward_batch_size_per_gpu=2",
        f"generator.n_samples_per_prompt={args.num_generations}",
        f"generator.max_generate_length={args.max_generate_length}",
        "trainer.policy.optimizer_config.lr=1e-3",
        "trainer.eval_interval=0",
        "trainer.eval_before_train=false",
        "trainer.ckpt_interval=0",
        "data.reward_fn=gsm8k_flexible",
        "trainer.algorithm.use_entropy_loss=true",
        f"trainer.seed={args.seed}",
    ]
    return own + [text for owner, text in map(split_forwarded, args.overrides) if owner in (None, strategy)]


def split_forwarded(text: str) -> tuple[str | None, str]:
    """`STRATEGY:key=value` -> (STRATEGY, key=value); `key=value` -> (None, key=value). Only the key is looked at."""
    key = text.split("=", 1)[0]
    if ":" in key:
        owner, rest = text.split(":", 1)
        return owner.strip(), rest
    return None, text


# --- one run ----------------------------------------------------------------------------------------------------
def run_once(args: argparse.Namespace, job: Job, strategy: str, run_dir: str) -> tuple[list[dict], str | None]:
    """The launcher in a subprocess (its own process group, killed afterwards so no Ray process outlives it).

    Returns the metrics rows that carry a loss, and None; or no rows and why the run failed."""
    from rl.core.subprocess_run import run_train

    try:
        proc = run_train(run_dir, overrides_for(args, job, strategy), threads=os.cpu_count() or 1,
                         timeout=args.timeout)
    except subprocess.TimeoutExpired as error:
        return [], f"timed out after {args.timeout} s\n{tail(error.output, error.stderr)}"
    if proc.returncode != 0:
        return [], f"exit status {proc.returncode}\n{tail(proc.stdout, proc.stderr)}"
    from rl.trainer.state.metrics import read_metrics

    path = os.path.join(run_dir, "metrics.jsonl")
    rows = [row for row in read_metrics(path) if "loss" in row] if os.path.exists(path) else []
    if len(rows) < args.steps:
        return [], f"{path} has {len(rows)} training rows, expected {args.steps}\n{tail(proc.stdout, proc.stderr)}"
    return rows, None


def tail(stdout: str, stderr: str) -> str:
    return f"--- stdout (tail) ---\n{stdout[-1500:]}\n--- stderr (tail) ---\n{stderr[-4000:]}"


def counted(rows: list[dict]) -> list[dict]:
    """Every step after the first (warm-up): step, training and generation seconds, tokens/s."""
    first = min(row["step"] for row in rows)
    return [
        {
            "step_s": row["step_time_s"],
            "generate_s": row["generate_time_s"],
            "train_s": row["step_time_s"] - row["generate_time_s"],
            "tokens_per_s": row["tokens_per_s"],
        }
        for row in rows
        if row["step"] > first
    ]


# --- report -----------------------------------------------------------------------------------------------------
def report(args: argparse.Namespace, outcomes: dict[str, Outcome]) -> str:
    measured = {name: o for name, o in outcomes.items() if o.steps}
    baseline = BASELINE if BASELINE in measured else next(iter(measured), None)
    base_tps = median([s["tokens_per_s"] for s in measured[baseline].steps]) if baseline else float("nan")
    rows = []
    for name, outcome in outcomes.items():
        if not outcome.steps:
            rows.append([name, f"FAILED ({len(outcome.failures)}/{args.rounds} runs)", "-", "-", "-", "-", "-"])
            continue
        tps = median([s["tokens_per_s"] for s in outcome.steps])
        status = f"{len(outcome.steps)}" + (f" ({len(outcome.failures)} runs failed)" if outcome.failures else "")
        rows.append(
            [
                name,
                status,
                median([s["step_s"] for s in outcome.steps]),
                median([s["train_s"] for s in outcome.steps]),
                tps,
                f"{tps / base_tps:.2f}x",
                f"{outcome.first_loss:.6g}",
            ]
        )
    header = (
        f"{args.model_size} Llama from rl.tasks.embedded; {args.prompts_per_step} prompts x {args.num_generations} "
        f"samples per step, <= {args.max_generate_length} new tokens; {args.workers} worker(s); {args.steps} steps "
        f"per run (1 warm-up), {args.rounds} round(s); {os.cpu_count()} cores"
    )
    forwarded = f"forwarded: {' '.join(args.overrides)}" if args.overrides else ""
    headers = ["strategy", "counted steps", "s/step", "train s/step", "tokens/s", f"vs {baseline}", "step-1 loss"]
    notes = "(medians over counted steps; train = step - generation, which is the same HF engine for every strategy)"
    return "\n".join(line for line in (header, forwarded, format_table(headers, rows), notes) if line)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    outcomes = {name: Outcome() for name in args.strategies}
    # Short run directories: Ray's socket paths under them must stay below 107 bytes.
    with tempfile.TemporaryDirectory(prefix="bench-strat-") as workdir:
        job = make_job(workdir, args)
        for round_index in range(args.rounds):
            for name in args.strategies:
                started = time.perf_counter()
                run_dir = os.path.join(workdir, f"{name}-{round_index + 1}")
                label = f"round {round_index + 1} {name}"
                print(f"{label}: started (stopped after {args.timeout} s)", flush=True)
                rows, failure = run_once(args, job, name, run_dir)
                took = time.perf_counter() - started
                if failure is not None:
                    outcomes[name].failures.append(failure)
                    print(f"{label}: FAILED after {took:.0f} s: {failure}", flush=True)
                    continue
                steps = counted(rows)
                outcomes[name].steps.extend(steps)
                loss = float(min(rows, key=lambda row: row["step"])["loss"])
                if outcomes[name].first_loss is None:
                    outcomes[name].first_loss = loss
                shown = ", ".join(f"{s['step_s']:.2f} s ({s['generate_s']:.2f} gen)" for s in steps)
                print(f"{label}: step-1 loss {loss:.6g}; {shown} (run {took:.0f} s)", flush=True)
    print(report(args, outcomes))
    return 0 if all(o.steps for o in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
