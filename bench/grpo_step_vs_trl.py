"""One GRPO training step side by side with TRL's `GRPOTrainer`: seconds per step and tokens per second.

    bazel run //bench:grpo_step_vs_trl -- [--scenarios=uniform,skewed] [--rounds=1] [--prompts_per_step=8] ...
    python -m bench.grpo_step_vs_trl --help

Both sides train the same randomly initialised Qwen2 (saved locally with a word-level chat tokenizer) on the same
synthetic arithmetic prompts in chat form, scored by the project's `gsm8k_flexible` reward, on CPU in fp32:
`--prompts_per_step` prompts x `--num_generations` completions per step, completions of at most
`--max_completion_length` tokens sampled at temperature 1, one optimizer step per rollout batch, GRPO advantages
(group-normalized), PPO-clip loss with a k3 KL term against a frozen reference (coefficient 0.001), AdamW.

- ours: the real launcher (`python -m rl.launch.train`) in a subprocess, strategy fsdp2 on one CPU worker, the
  `hf` generation engine; per-step `step_time_s` and `tokens_per_s` come from the run's metrics.jsonl.
- TRL: `GRPOTrainer` in this process (`use_vllm=False`, fp32, no gradient checkpointing, one generation batch per
  optimizer step); a callback times each step from `on_step_begin` to `on_step_end` and counts TRL's own
  prompt + completion token total (`num_input_tokens_seen`).

Response lengths depend on what the model samples, so compare tokens/s. A random model samples the end token about
once per vocabulary size, so `--scenarios` runs two cases (see --help): `uniform` (every completion runs to the limit,
so nothing is padded) and `skewed` (many short completions and a few long ones, which TRL pads to the longest).

A step is generation + scoring + logprobs + the update (+ weight sync to the generator for ours). The first step of
each run is a warm-up and is not counted.
`--rounds` > 1 repeats both runs alternately; the table shows medians over every counted step. Each side uses every
core (ours' training worker takes cores // workers threads by itself; its driver and TRL get the same count).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass

from bench.common import ModelShape, format_table, median, save_model, set_threads

KL_COEF = 0.001


@dataclass(frozen=True)
class Scenario:
    """Response lengths follow from how often the random model samples the end token, i.e. from the vocabulary."""

    vocab_size: int
    max_completion_length: int
    about: str


SCENARIOS = {
    "uniform": Scenario(2048, 64, "vocabulary 2048, completions <= 64 tokens; the model almost never samples the end "
                                  "token, so every completion runs to the limit (equal lengths, nothing to pad)"),
    "skewed": Scenario(40, 128, "vocabulary 40, completions <= 128 tokens; the end token comes at about 1 in 40 per "
                                "step, so lengths are skewed: many short, a few at the limit (as rollouts are)"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts_per_step", type=int, default=8, help="prompts per training step")
    parser.add_argument("--num_generations", type=int, default=4, help="completions per prompt (group size)")
    parser.add_argument("--max_prompt_length", type=int, default=64, help="prompt token limit (prompts are shorter)")
    parser.add_argument("--scenarios", default="uniform,skewed",
                        help="comma-separated subset of: " + "; ".join(f"{k}: {v.about}" for k, v in SCENARIOS.items()))
    parser.add_argument("--max_completion_length", type=int, default=None,
                        help="most new tokens per completion (default: the scenario's)")
    parser.add_argument("--steps", type=int, default=3, help="counted steps per run, after one warm-up step")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side, alternating")
    parser.add_argument("--lr", type=float, default=1e-6, help="learning rate on both sides")
    parser.add_argument("--max_tokens_per_micro_batch", type=int, default=1024,
                        help="ours: packed micro-batch budget (trainer.max_tokens_per_micro_batch)")
    parser.add_argument("--hidden", type=int, default=256, help="model: hidden size")
    parser.add_argument("--layers", type=int, default=4, help="model: decoder layers")
    parser.add_argument("--heads", type=int, default=4, help="model: attention heads")
    parser.add_argument("--intermediate", type=int, default=1024, help="model: MLP width")
    parser.add_argument("--vocab_size", type=int, default=None, help="model and tokenizer vocabulary (default: the "
                                                                      "scenario's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    parser.add_argument("--sides", default="ours,trl",
                        help="comma-separated subset of ours (packed micro-batches), ours_padded (packing off, one "
                             "padded micro-batch like TRL's) and trl")
    return parser.parse_args(argv)


def prompt_rows(count: int, seed: int) -> list[dict]:
    """Two-operand additions as one-turn chat prompts, with the sum as the reference answer."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        left, right = rng.randint(0, 999), rng.randint(0, 999)
        rows.append({"prompt": [{"role": "user", "content": f"What is {left} + {right}?"}],
                     "answer": str(left + right)})
    return rows


def write_parquet(rows: list[dict], path: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --- ours -----------------------------------------------------------------------------------------------------------
def our_overrides(args: argparse.Namespace, model_path: str, train_path: str, packed: bool = True) -> list[str]:
    steps = args.steps + 1
    return [
        f"trainer.policy.model.path={model_path}",
        f"data.train_data=['{train_path}']",
        "data.val_data=[]",
        "data.reward_fn=gsm8k_flexible",
        "trainer.strategy=fsdp2",
        f"trainer.max_steps={steps}",
        f"trainer.train_batch_size={args.prompts_per_step}",
        f"trainer.policy_mini_batch_size={args.prompts_per_step}",
        f"trainer.micro_train_batch_size_per_gpu={args.prompts_per_step * args.num_generations}",
        f"trainer.micro_forward_batch_size_per_gpu={args.prompts_per_step * args.num_generations}",
        f"trainer.use_sample_packing={str(packed).lower()}",
        f"trainer.max_tokens_per_micro_batch={args.max_tokens_per_micro_batch if packed else 'null'}",
        "trainer.placement.policy_num_gpus_per_node=1",
        f"generator.n_samples_per_prompt={args.num_generations}",
        f"generator.max_generate_length={args.max_completion_length}",
        f"generator.max_prompt_length={args.max_prompt_length}",
        "generator.temperature=1.0",
        f"trainer.policy.optimizer_config.lr={args.lr}",
        "trainer.policy.optimizer_config.weight_decay=0.0",
        "trainer.algorithm.use_kl_loss=true",
        f"trainer.algorithm.kl_loss_coef={KL_COEF}",
        "trainer.algorithm.kl_estimator_type=k3",
        "trainer.eval_interval=0",
        "trainer.eval_before_train=false",
        "trainer.ckpt_interval=0",
        "trainer.logger=['console']",
        f"trainer.seed={args.seed}",
    ]


def run_ours(args: argparse.Namespace, model_path: str, train_path: str, workdir: str, packed: bool) -> list[dict]:
    """The launcher in a subprocess; the counted steps' rows of metrics.jsonl."""
    from rl.core.subprocess_run import run_train

    run_dir = tempfile.mkdtemp(prefix="ours-", dir=workdir)
    proc = run_train(run_dir, our_overrides(args, model_path, train_path, packed), threads=os.cpu_count() or 1)
    if proc.returncode != 0:
        raise RuntimeError(f"the launcher failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"step_s": r["step_time_s"], "tokens": r["tokens_per_s"] * r["step_time_s"],
             "generate_s": r["generate_time_s"],
             "parts": {part: r[f"{part}_time_s"] for part in ("logprobs", "update", "sync") if f"{part}_time_s" in r}}
            for r in rows if r["step"] > 1]


# --- TRL ------------------------------------------------------------------------------------------------------------
def gsm8k_flexible_for_trl():
    """The project's reward with TRL's reward-function signature (completions are chat turns)."""
    from rl.core.rewards import REWARD_FUNCTIONS
    from rl.tasks import rewards as _task_rewards  # noqa: F401  (registers the tasks' reward functions)

    reward = REWARD_FUNCTIONS.get("gsm8k_flexible")

    def gsm8k_flexible(prompts, completions, answer, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward(text, ref) for text, ref in zip(texts, answer, strict=True)]

    return gsm8k_flexible


def step_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time and prompt + completion tokens of every optimizer step."""

        def __init__(self):
            self.steps: list[dict] = []
            self._start = self._tokens = 0.0

            self.generate_s = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start, self._tokens, self.generate_s = time.perf_counter(), state.num_input_tokens_seen, 0.0

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append({"step_s": time.perf_counter() - self._start, "generate_s": self.generate_s,
                               "tokens": float(state.num_input_tokens_seen - self._tokens)})

        def time_generation(self, trainer) -> None:
            """Wraps this trainer's `_generate` (rollouts and their decoding) to add its time to the step's."""
            generate = getattr(trainer, "_generate", None)
            if generate is None:
                return

            def timed(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return generate(*args, **kwargs)
                finally:
                    self.generate_s += time.perf_counter() - started

            trainer._generate = timed

    return StepTimer()


def run_trl(args: argparse.Namespace, model_path: str, rows: list[dict], workdir: str) -> list[dict]:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    completions = args.prompts_per_step * args.num_generations
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-", dir=workdir),
        per_device_train_batch_size=completions,
        gradient_accumulation_steps=1,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=1.0,
        learning_rate=args.lr,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        beta=KL_COEF,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        max_steps=args.steps + 1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        use_vllm=False,
        model_init_kwargs={"dtype": torch.float32},
        seed=args.seed,
        data_seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    timer = step_timer()
    trainer = GRPOTrainer(model=model_path, reward_funcs=gsm8k_flexible_for_trl(), args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)  # its per-step log dicts would bury the table
    timer.time_generation(trainer)
    trainer.train()
    return timer.steps[1:]


# --- report ---------------------------------------------------------------------------------------------------------
def _parts(step: dict) -> str:
    """Ours' step breakdown after generation (reference/old logprobs, update, weight sync), when reported."""
    return "".join(f", {value:.2f} {part}" for part, value in step.get("parts", {}).items())


def summarize(steps: list[dict]) -> dict[str, float]:
    step_s = median([s["step_s"] for s in steps])
    return {"steps": len(steps), "step_s": step_s, "generate_s": median([s["generate_s"] for s in steps]),
            "rest_s": median([s["step_s"] - s["generate_s"] for s in steps]),
            "tokens": median([s["tokens"] for s in steps]),
            "tokens_per_s": median([s["tokens"] / s["step_s"] for s in steps])}


def report(args: argparse.Namespace, scenario: str, shape: ModelShape, results: dict[str, list[dict]]) -> str:
    summary = {side: summarize(steps) for side, steps in results.items()}
    rows = [[side, s["steps"], s["step_s"], s["generate_s"], s["rest_s"], s["tokens"],
             s["tokens_per_s"]] for side, s in summary.items()]
    lines = [
        f"scenario {scenario}: {shape.describe()}; {args.prompts_per_step} prompts x {args.num_generations} "
        f"completions per step, completions <= {args.max_completion_length} tokens; {os.cpu_count()} torch threads",
        format_table(["side", "counted steps", "step s", "generate s", "rest s", "tokens/step", "tokens/s"], rows),
        "(medians over counted steps; generate: rollouts, rest: scoring, logprobs, update, weight sync)",
    ]
    trl = summary.get("trl")
    for side in ("ours", "ours_padded"):
        if trl is not None and side in summary:
            ours = summary[side]
            lines.append(f"{side} / TRL: tokens/s {ours['tokens_per_s'] / trl['tokens_per_s']:.2f}x, "
                         f"step time {trl['step_s'] / ours['step_s']:.2f}x as fast")
    return "\n".join(lines)


def scenario_args(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """`args` with the scenario's vocabulary and completion limit where the command line left them unset."""
    if name not in SCENARIOS:
        raise SystemExit(f"--scenarios: unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    preset = SCENARIOS[name]
    values = vars(args).copy()
    values["vocab_size"] = args.vocab_size or preset.vocab_size
    values["max_completion_length"] = args.max_completion_length or preset.max_completion_length
    return argparse.Namespace(**values)


def run_scenario(args: argparse.Namespace, name: str, workdir: str) -> str:
    """Every side, `--rounds` times alternately, on one model and prompt set; returns the scenario's report."""
    sides = args.sides.split(",")
    shape = ModelShape(args.hidden, args.layers, args.heads, args.intermediate, args.vocab_size,
                       max_positions=max(256, 2 * (args.max_prompt_length + args.max_completion_length)))
    model_path = save_model(os.path.join(workdir, "model"), shape, seed=args.seed)
    rows = prompt_rows(max(256, 4 * args.prompts_per_step * (args.steps + 1)), args.seed)
    train_path = write_parquet(rows, os.path.join(workdir, "train.parquet"))
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for round_index in range(args.rounds):
        for side in sides:
            started = time.perf_counter()
            if side == "trl":
                steps = run_trl(args, model_path, rows, workdir)
            else:
                steps = run_ours(args, model_path, train_path, workdir, packed=side == "ours")
            results[side].extend(steps)
            shown = ", ".join(f"{s['step_s']:.2f} s ({s['generate_s']:.2f} gen{_parts(s)})/{s['tokens']:.0f} tok"
                              for s in steps)
            print(f"{name} round {round_index + 1} {side}: {shown} (run {time.perf_counter() - started:.0f} s)",
                  flush=True)
    return report(args, name, shape, results)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads(0)  # every core, as ours' training worker takes (cores // workers) and its driver generates with
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    reports = []
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as workdir:
        for name in args.scenarios.split(","):
            scenario_dir = os.path.join(workdir, name)
            os.makedirs(scenario_dir)
            reports.append(run_scenario(scenario_args(args, name), name, scenario_dir))
    print("\n\n".join(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
