"""LoRA against full fine-tuning on a ~0.5B random model: optimizer state, peak memory of a training step and step
time, through the real training path (`TrainingBackend.forward_backward` + `optimizer_step`), in one run.

    PYTHONPATH=. python -m bench.lora_memory [--strategy fsdp2] [--tokens 256] [--rank 8] [--steps 3]

The model has Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, vocabulary 151,936, tied
embeddings; 494M parameters) with random weights, fp32, one process. LoRA: rank 8, alpha 16, every linear layer.
Each variant runs in a fresh process. Peak = growth of the peak resident set (VmHWM, reset through
/proc/self/clear_refs once model and batch exist) over the steps, with glibc's mmap threshold fixed at 128 KiB so
freed tensors leave the resident set; it covers activations, gradients and the optimizer state the first step
creates. Step time is the mean of the steps after the first.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import torch

from bench.common import format_table, memory_child, status_kib

QWEN_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=4096)
LORA = dict(alpha=16, dropout=0.0, target_modules=["all-linear"], exclude_modules=None, init_method="kaiming",
            merge_on_export=False)


def _model(directory: str) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**QWEN_05B)).save_pretrained(directory)
    return directory


def _batch(tokens: int):
    from rl.core.packing import pack_sequences

    g = torch.Generator().manual_seed(0)
    seqs, per = [], tokens // 4
    for _ in range(4):
        mask = torch.arange(per) >= per // 4
        seqs.append({"input_ids": torch.randint(0, QWEN_05B["vocab_size"], (per,), generator=g), "loss_mask": mask,
                     "advantages": torch.randn(per, generator=g) * mask, "old_logprobs": torch.full((per,), -12.0)})
    return pack_sequences(seqs)


def run_child(args) -> dict:
    from rl.backends.base import ModelSpec
    from rl.backends.dist import init_distributed
    from rl.backends.registry import build_backend
    from rl.core.algorithms import LossSettings

    info = init_distributed(0, 1, "127.0.0.1", args.port)
    lora = dict(LORA, rank=args.rank) if args.lora else None
    spec = ModelSpec(path=args.model, role="policy", temperature=1.0, lr=1e-5, lora=lora)
    backend = build_backend(args.strategy, spec, info)
    batch, settings = _batch(args.tokens), LossSettings(use_kl_loss=False)
    normalizer = settings.normalizer(batch.loss_mask, seq_ids=batch.token_seq_ids(), num_sequences=4)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base, seconds = status_kib("VmRSS"), []
    for _ in range(args.steps):
        start = time.perf_counter()
        backend.forward_backward(batch, settings, normalizer)
        backend.optimizer_step()
        seconds.append(time.perf_counter() - start)
    peak = (status_kib("VmHWM") - base) / 1024
    optimizer = getattr(backend, "engine", None)
    optimizer = optimizer.optimizer if optimizer is not None else backend.optimizer
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if isinstance(t, torch.Tensor))
    trainable = sum(p.numel() for p in backend.model.parameters() if p.requires_grad)
    return {"peak_mib": peak, "optimizer_mib": state / 2**20, "trainable": trainable,
            "step_s": sum(seconds[1:]) / max(len(seconds) - 1, 1)}


def _child(args, lora: bool, model: str, port: int) -> dict:
    cmd = [sys.executable, "-m", "bench.lora_memory", "--child", "--model", model, "--port", str(port),
           "--strategy", args.strategy, "--tokens", str(args.tokens), "--rank", str(args.rank), "--steps",
           str(args.steps)] + (["--lora"] if lora else [])
    return memory_child(cmd, f"lora={lora}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", default="fsdp2", choices=("fsdp2", "deepspeed"))
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=29685, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args)))
        return 0
    with tempfile.TemporaryDirectory() as directory:
        model = _model(directory)
        full, lora = _child(args, False, model, 29685), _child(args, True, model, 29686)
    rows = [[name, f"{r['trainable']:,}", r["optimizer_mib"], r["peak_mib"], r["step_s"]]
            for name, r in (("full fine-tuning", full), (f"LoRA rank {args.rank}", lora))]
    rows.append(["LoRA / full", f"{lora['trainable'] / full['trainable']:.4f}",
                 lora["optimizer_mib"] / full["optimizer_mib"], lora["peak_mib"] / full["peak_mib"],
                 lora["step_s"] / full["step_s"]])
    print(f"Qwen2.5-0.5B shape, random weights, fp32, {args.strategy}, one process, {args.tokens} tokens per step, "
          f"{args.steps} steps")
    print(format_table(["", "trainable params", "optimizer state MiB", "step peak MiB", "step s"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
