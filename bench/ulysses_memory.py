"""Sequence splitting, peak memory per rank of one training micro-batch holding one long sequence, in one run:
Ulysses SP=1 (one process) against SP=2 (two processes, one group) through fsdp2, and megatron's context
parallelism CP=1 against CP=2, each through the real training path (`forward_backward` / `train_micro_batches`).

    PYTHONPATH=. python -m bench.ulysses_memory [--tokens 16384] [--megatron-tokens 8192] [--checkpointing]

The model is a random Qwen2 (hidden 512, 4 layers, 8 heads, 4 KV heads, MLP 1536, vocabulary 32,000), fp32; all but
the first 512 tokens (the prompt) are in the loss. Megatron's packed attention on CPU is SDPA's math kernel with a
[T, T] mask (it materializes [heads, T, T] scores), so its sequence is shorter. Peak = growth of each rank's peak
resident set (VmHWM, reset through /proc/self/clear_refs once model and batch exist) over one forward and backward,
with glibc's mmap threshold fixed at 128 KiB so freed tensors leave the resident set: activations, logits and the
(sharded) gradients.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import torch

from bench.common import format_table, free_port, memory_child, status_kib

PROMPT = 512
MODEL = dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, tie_word_embeddings=True, max_position_embeddings=65536)


def _model(directory: str) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**MODEL)).save_pretrained(directory)
    return directory


def _rank(rank: int, args) -> None:
    from rl.backends.base import ModelSpec
    from rl.backends.dist import init_distributed
    from rl.backends.registry import build_backend
    from rl.core.algorithms import LossSettings
    from rl.core.packing import pack_sequences

    torch.set_num_threads(1)
    info = init_distributed(rank, args.sp, "127.0.0.1", args.port)
    megatron = args.strategy == "megatron"
    spec = ModelSpec(path=args.model, role="policy", temperature=1.0, lr=1e-5,
                     gradient_checkpointing=args.checkpointing, sequence_parallel_size=1 if megatron else args.sp,
                     backend_options={"context_parallel_size": args.sp} if megatron else None)
    backend = build_backend(args.strategy, spec, info)
    g = torch.Generator().manual_seed(0)
    n = args.tokens
    mask = torch.arange(n) >= PROMPT  # a long response after a short prompt: long-reasoning RL
    batch = pack_sequences([{"input_ids": torch.randint(1, MODEL["vocab_size"], (n,), generator=g),
                             "loss_mask": mask, "advantages": torch.randn(n, generator=g) * mask,
                             "old_logprobs": torch.full((n,), -10.0)}])
    settings = LossSettings(use_kl_loss=False)
    normalizer = settings.normalizer(batch.loss_mask, seq_ids=batch.token_seq_ids(), num_sequences=1)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status_kib("VmRSS")
    start = time.perf_counter()
    metrics = backend.train_micro_batches([batch], settings, normalizer)
    seconds = time.perf_counter() - start
    losses: list = [None] * args.sp
    torch.distributed.all_gather_object(losses, metrics["loss"] if metrics else None)
    loss = next(value for value in losses if value is not None)
    peaks: list = [None] * args.sp
    torch.distributed.all_gather_object(peaks, (status_kib("VmHWM") - base) / 1024)
    if rank == 0:
        print(json.dumps({"peak_mib": max(peaks), "seconds": seconds, "loss": loss}))


def _child(args, strategy: str, tokens: int, sp: int, model: str) -> dict:
    cmd = [sys.executable, "-m", "bench.ulysses_memory", "--child", "--model", model, "--sp", str(sp),
           "--port", str(free_port()), "--tokens", str(tokens), "--strategy", strategy] + \
        (["--checkpointing"] if args.checkpointing else [])
    return memory_child(cmd, f"{strategy} split={sp}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384, help="the fsdp2 (Ulysses) sequence")
    parser.add_argument("--megatron-tokens", type=int, default=8192, help="the megatron (CP) sequence")
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="fsdp2", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--sp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        torch.multiprocessing.spawn(_rank, args=(args,), nprocs=args.sp)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        model = _model(directory)
        for strategy, tokens, split in (("fsdp2", args.tokens, "Ulysses SP"), ("megatron", args.megatron_tokens,
                                                                                "CP")):
            one, two = _child(args, strategy, tokens, 1, model), _child(args, strategy, tokens, 2, model)
            rows += [[f"{strategy} {split}=1", tokens, one["peak_mib"], one["seconds"], one["loss"]],
                     [f"{strategy} {split}=2 (per rank)", tokens, two["peak_mib"], two["seconds"], two["loss"]],
                     [f"{strategy} {split}=2 / {split}=1", "", two["peak_mib"] / one["peak_mib"],
                      two["seconds"] / one["seconds"], ""]]
    print(f"one sequence, gradient checkpointing {'on' if args.checkpointing else 'off'}, random Qwen2 hidden 512 x "
          "4 layers, vocabulary 32,000, fp32")
    print(format_table(["", "tokens", "forward+backward peak MiB", "seconds", "loss"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
