"""Megatron pipeline schedule: PP=2 with all micro-batches of a mini-batch in one 1F1B schedule (plain, and
interleaved over two model chunks per rank: virtual_pipeline_model_parallel_size=2), against the same job with one
micro-batch per schedule call (stages run one after the other) and against PP=1 x DP=2.

Two gloo worker processes build the megatron backend (`rl.backends.registry.build_backend`) over a small random
Qwen2 model and train on the same 16 packed sequences per mini-batch, split into `--micro_batches` micro-batches
(per data-parallel shard). Every variant runs `--steps` optimizer steps after one warm-up step, in turns for
`--rounds` rounds; the table shows the median step time.

    PYTHONPATH=. python -m bench.megatron_pipeline        # or: bazel run //bench:megatron_pipeline
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.common import free_port

VARIANTS = {
    "pp2, one schedule over all micro-batches (1F1B)": ({"pipeline_model_parallel_size": 2}, "schedule"),
    "pp2 x vp2, interleaved 1F1B over all micro-batches": (
        {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}, "schedule"),
    "pp2, one micro-batch per schedule call": ({"pipeline_model_parallel_size": 2}, "one_by_one"),
    "pp1 x dp2, one schedule per shard": ({}, "schedule"),
}


def make_model(path: str, layers: int, hidden: int, vocab: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128, pad_token_id=0,
                         tie_word_embeddings=False, max_position_embeddings=1024)
    Qwen2ForCausalLM(config).save_pretrained(path)


def sequences(count: int, length: int, vocab: int) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        mask = torch.arange(length) >= length // 4
        out.append({"input_ids": torch.randint(1, vocab, (length,), generator=g), "loss_mask": mask,
                    "advantages": torch.randn(length, generator=g) * mask, "old_logprobs": -torch.rand(length) * mask})
    return out


def micro_batches(seqs: list[dict], dp_size: int, dp_index: int, count: int):
    from rl.core.packing import pack_sequences

    mine = seqs[dp_index::dp_size]
    per = -(-len(mine) // count)
    return [pack_sequences(mine[i * per:(i + 1) * per]) for i in range(count)]


def _step(backend, batches, settings, normalizer, mode: str) -> float:
    started = time.perf_counter()
    if mode == "schedule":
        backend.train_micro_batches(batches, settings, normalizer)
    else:
        for batch in batches:
            backend.train_micro_batches([batch], settings, normalizer)
    backend.optimizer_step()
    dist.barrier()
    return time.perf_counter() - started


def _worker(rank: int, world: int, port: int, args, path: str, out: str) -> None:
    from megatron.core import parallel_state

    from rl.backends.base import ModelSpec
    from rl.backends.dist import init_distributed
    from rl.backends.registry import build_backend
    from rl.core.algorithms import LossNormalizer, LossSettings

    torch.set_num_threads(args.threads)
    info = init_distributed(rank, world, "127.0.0.1", port)
    seqs = sequences(args.sequences, args.length, args.vocab)
    settings = LossSettings(use_kl_loss=False)
    tokens = sum(int(s["loss_mask"].sum()) for s in seqs)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _round in range(args.rounds):
        for name, (options, mode) in VARIANTS.items():
            spec = ModelSpec(path=path, role="policy", temperature=1.0, lr=1e-5, backend_options=options)
            backend = build_backend("megatron", spec, info)
            layout = backend.data_parallel_rank()
            batches = micro_batches(seqs, layout.size, layout.index, args.micro_batches)
            normalizer = LossNormalizer.from_counts("token_mean", tokens, len(seqs), dp_world_size=layout.size)
            _step(backend, batches, settings, normalizer, mode)  # warm-up
            times[name] += [_step(backend, batches, settings, normalizer, mode) for _ in range(args.steps)]
            del backend
            parallel_state.destroy_model_parallel()
    if rank == 0:
        torch.save(times, out)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--micro_batches", type=int, default=8, help="micro-batches per mini-batch and shard")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--length", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker process")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path, out = os.path.join(tmp, "model"), os.path.join(tmp, "times.pt")
        make_model(path, args.layers, args.hidden, args.vocab)
        mp.spawn(_worker, args=(2, free_port(), args, path, out), nprocs=2)
        times = torch.load(out)
    baseline = statistics.median(times["pp2, one micro-batch per schedule call"])
    print(f"{args.sequences} x {args.length}-token sequences per mini-batch, {args.micro_batches} micro-batches per "
          f"shard, {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; 2 worker processes, "
          f"{args.threads} thread(s) each; median of {args.steps * args.rounds} steps")
    print("| variant | step s | speed-up vs one micro-batch per call |\n|---|---:|---:|")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"| {name} | {median:.3f} | {baseline / median:.2f}x |")


if __name__ == "__main__":
    main()
