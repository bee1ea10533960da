"""Packed vs padded micro-batches: one GRPO policy update through the fsdp2 backend, in real tokens per second.

    bazel run //bench:packing_vs_padding -- [--max_tokens 256 512 1024 2048] [--micro_batch_size 2 4] ...
    python -m bench.packing_vs_padding --help

One process, world size 1 (gloo), the production worker (`rl.backends.worker.TrainingWorker`) holding an fsdp2
policy. A step is what `rl.trainer.policy_update` asks of a worker for one mini-batch: a forward pass for the
old logprobs over every micro-batch, then forward/backward over every micro-batch and one optimizer step (GRPO
loss with the k3 KL term against fixed reference logprobs). Every layout gets the same sequences, drawn from a
skewed length mix (many short, some long, shuffled, as GRPO rollouts are):

- padded@S: `MicroBatching(packed=False, micro_batch_size=S)`, S consecutive sequences per micro-batch, each padded
  to the longest of its micro-batch;
- packed@B: `MicroBatching(packed=True, max_tokens=B)`, sequences bin-packed into micro-batches of at most B tokens.

Throughput counts real tokens only (padding excluded). Layouts take turns within each repeat; the table shows
medians of wall time and of this process's CPU time (the latter moves less when other processes share the cores).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch
import torch.distributed as dist

from bench.common import ModelShape, format_table, free_port, median, save_model, set_threads


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num_sequences", type=int, default=32, help="sequences in the mini-batch")
    parser.add_argument("--short", type=int, nargs=2, default=(24, 96), metavar=("MIN", "MAX"),
                        help="length range of short sequences (tokens, prompt included)")
    parser.add_argument("--long", type=int, nargs=2, default=(192, 256), metavar=("MIN", "MAX"),
                        help="length range of long sequences")
    parser.add_argument("--long_fraction", type=float, default=0.25, help="share of long sequences")
    parser.add_argument("--prompt_length", type=int, default=24, help="leading tokens outside the loss")
    parser.add_argument("--micro_batch_size", type=int, nargs="+", default=[2, 4],
                        help="sequences per padded micro-batch; each value is one padded layout")
    parser.add_argument("--max_tokens", type=int, nargs="+", default=[512, 1024],
                        help="token budget of a packed micro-batch (trainer.max_tokens_per_micro_batch); each value "
                             "is one packed layout")
    parser.add_argument("--hidden", type=int, default=256, help="model: hidden size")
    parser.add_argument("--layers", type=int, default=4, help="model: decoder layers")
    parser.add_argument("--heads", type=int, default=4, help="model: attention heads")
    parser.add_argument("--intermediate", type=int, default=1024, help="model: MLP width")
    parser.add_argument("--vocab_size", type=int, default=2048, help="model and tokenizer vocabulary")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per layout, after one warm-up step")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads, 0 for every core; 1 keeps timings steady on cores shared with others")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data")
    return parser.parse_args(argv)


def skewed_lengths(args: argparse.Namespace) -> list[int]:
    rng = random.Random(args.seed)
    count_long = round(args.num_sequences * args.long_fraction)
    lengths = [rng.randint(*args.long) for _ in range(count_long)]
    lengths += [rng.randint(*args.short) for _ in range(args.num_sequences - count_long)]
    rng.shuffle(lengths)
    return lengths


def make_sequences(lengths: list[int], prompt_length: int, vocab_size: int, seed: int) -> list[dict]:
    """Token ids, the loss mask on the response, and one GRPO advantage per sequence on its response tokens."""
    g = torch.Generator().manual_seed(seed)
    sequences = []
    for length in lengths:
        mask = torch.arange(length) >= min(prompt_length, length - 1)
        advantage = torch.randn((), generator=g)
        sequences.append({
            "input_ids": torch.randint(3, vocab_size, (length,), generator=g),
            "loss_mask": mask,
            "advantages": torch.where(mask, advantage, 0.0),
        })
    return sequences


def build_worker(model_path: str, lr: float = 1e-5):
    from rl.backends.base import ModelSpec
    from rl.backends.worker import TrainingWorker

    worker = TrainingWorker(rank=0, world_size=1, seed=0)
    spec = ModelSpec(path=model_path, role="policy", temperature=1.0, lr=lr)
    worker.setup(*worker.host_rendezvous(1), "fsdp2", spec, None)
    return worker


def logprobs_into(worker, batching, sequences: list[dict], field: str) -> None:
    from rl.trainer.batching import attach, gather

    batches = batching.split(sequences)
    attach(sequences, field, gather(batches, [worker.logprobs(batches[0])], len(sequences)))


def update_step(worker, batching, settings, sequences: list[dict]) -> dict[str, float]:
    """Old logprobs, then forward/backward over every micro-batch and one optimizer step."""
    from rl.trainer.policy_update import normalizer

    logprobs_into(worker, batching, sequences, "old_logprobs")
    return worker.train_mini_batch(batching.split(sequences)[0], settings, normalizer(settings, sequences, 1))


def layout_stats(batching, sequences: list[dict]) -> dict[str, float]:
    batches = batching.split(sequences)[0]
    processed = sum(b.num_tokens for b in batches)
    real = sum(len(s["input_ids"]) for s in sequences)
    return {"micro_batches": len(batches), "processed": processed, "padding": 1 - real / processed,
            "largest": max(b.num_tokens for b in batches)}


def run(args: argparse.Namespace, model_dir: str) -> dict[str, dict]:
    from rl.backends.dist import init_distributed
    from rl.core.algorithms import LossSettings
    from rl.trainer.batching import MicroBatching

    shape = ModelShape(args.hidden, args.layers, args.heads, args.intermediate, args.vocab_size,
                       max_positions=max(args.long[1], args.short[1]))
    save_model(model_dir, shape, seed=args.seed, with_tokenizer=False)
    lengths = skewed_lengths(args)
    sequences = make_sequences(lengths, args.prompt_length, args.vocab_size, args.seed)
    init_distributed(0, 1, "127.0.0.1", free_port())
    worker = build_worker(model_dir)
    layouts = {f"padded@{size}": MicroBatching(packed=False, max_tokens=max(lengths), micro_batch_size=size,
                                               dp_size=1) for size in args.micro_batch_size}
    for budget in args.max_tokens:
        layouts[f"packed@{budget}"] = MicroBatching(packed=True, max_tokens=budget, micro_batch_size=1, dp_size=1)
    settings = LossSettings(use_kl_loss=True, kl_loss_coef=0.001)
    logprobs_into(worker, layouts[next(iter(layouts))], sequences, "ref_logprobs")
    print(f"model: {shape.describe()}; {len(lengths)} sequences, {sum(lengths)} real tokens, lengths "
          f"{min(lengths)}..{max(lengths)} (mean {sum(lengths) / len(lengths):.0f}); threads {torch.get_num_threads()}",
          flush=True)
    times: dict[str, list[float]] = {name: [] for name in layouts}
    cpu_times: dict[str, list[float]] = {name: [] for name in layouts}
    for repeat in range(args.repeats + 1):  # repeat 0 warms up
        for name, batching in layouts.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            update_step(worker, batching, settings, sequences)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
            print(f"  {'warm-up' if repeat == 0 else f'repeat {repeat}'}  {name:11s}  {elapsed:7.2f} s wall  "
                  f"{cpu:7.2f} s cpu", flush=True)
            if repeat:
                times[name].append(elapsed)
                cpu_times[name].append(cpu)
    dist.destroy_process_group()
    real = sum(lengths)
    return {name: {**layout_stats(batching, sequences), "step_s": median(times[name]),
                   "tokens_per_s": real / median(times[name]), "cpu_s": median(cpu_times[name])}
            for name, batching in layouts.items()}


def report(results: dict[str, dict]) -> str:
    rows = [[name, r["micro_batches"], r["largest"], r["processed"], f"{100 * r['padding']:.1f}%", r["step_s"],
             r["cpu_s"], r["tokens_per_s"]] for name, r in results.items()]
    table = format_table(["layout", "micro-batches", "largest mb (tok)", "tokens processed", "padding",
                          "step s (median)", "cpu s (median)", "real tokens/s"], rows)
    lines = [table, "(padded@S: S sequences per micro-batch; packed@B: at most B tokens per micro-batch)"]
    padded = [name for name in results if name.startswith("padded")]
    packed = [name for name in results if name.startswith("packed")]
    if padded and packed:
        ratios = [[name, *(results[name]["tokens_per_s"] / results[base]["tokens_per_s"] for base in padded)]
                  for name in packed]
        lines += ["", "throughput ratio packed / padded (real tokens/s, medians):",
                  format_table(["", *(f"/ {base} ({100 * results[base]['padding']:.0f}% pad)" for base in padded)],
                               ratios)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    args = parse_args(argv)
    set_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-packing-") as tmp:
        results = run(args, tmp)
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
