"""Peak memory of one training step (forward, loss, backward) through the real training paths, with
trainer.policy.use_fused_kernels off (logits) and on (chunked from hidden states), at Qwen2's vocabulary.

    PYTHONPATH=. python -m bench.kernels_training_memory [--tokens 4096 --vocab 151936 --hidden 1024]

HF strategies (fsdp2, deepspeed ZeRO-2, fsdp; one process each): a 1-layer Qwen2 body with tied embeddings,
`TrainingBackend.forward_backward` on one packed micro-batch whose every position but the sequence starts predicts a
loss token (GRPO clip, k3 KL, token_mean). Megatron (`megatron-tp2`, two gloo processes): the output layer's
weight split by vocabulary rows, `vocab_parallel_chunked_loss` with its default chunk against the same function in
one chunk (each rank's whole [tokens, V/2] logits: the memory of the unchunked vocab-parallel path).

Each variant runs in a fresh process. Peak memory is the growth of the peak resident set (VmHWM, reset through
/proc/self/clear_refs once model and batch exist) during the step, with glibc's mmap threshold fixed at 128 KiB so
that freed tensors leave the resident set; for TP=2 the larger of the two ranks. The loss
and the norm of every parameter's gradient are compared between the two paths of each strategy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

from bench.common import format_table, memory_child, status_kib

VARIANTS = ("fsdp2", "deepspeed", "fsdp", "megatron-tp2")
SETTINGS_KW = dict(use_kl_loss=True, kl_estimator_type="k3", kl_loss_coef=0.01)


def _measure(step) -> tuple[float, float]:
    """(peak growth MiB, seconds) of `step()` over the resident set before it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base, start = status_kib("VmRSS"), time.perf_counter()
    step()
    return (status_kib("VmHWM") - base) / 1024, time.perf_counter() - start


def _model(args, directory: str) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                         num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=True,
                         max_position_embeddings=4096)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    return directory


def _batch(args):
    from rl.core.packing import pack_sequences

    g = torch.Generator().manual_seed(0)
    seqs, per_seq = [], args.tokens // args.sequences + 1  # + 1: the first token of a sequence predicts nothing
    for _ in range(args.sequences):
        mask = torch.arange(per_seq) >= 1
        seqs.append({"input_ids": torch.randint(0, args.vocab, (per_seq,), generator=g), "loss_mask": mask,
                     "advantages": torch.randn(per_seq, generator=g) * mask,
                     "old_logprobs": torch.full((per_seq,), -12.0), "ref_logprobs": torch.full((per_seq,), -12.0)})
    return pack_sequences(seqs)


def run_hf(args) -> dict:
    from rl.backends.base import ModelSpec
    from rl.backends.dist import init_distributed
    from rl.backends.registry import build_backend
    from rl.core.algorithms import LossSettings

    info = init_distributed(0, 1, "127.0.0.1", args.port)
    spec = ModelSpec(path=args.model, role="policy", temperature=1.0, fused_kernels=args.fused, kernels="torch",
                     fused_chunk_size=args.chunk_size, gradient_checkpointing=args.gradient_checkpointing)
    backend = build_backend(args.variant, spec, info)
    batch = _batch(args)
    settings = LossSettings(**SETTINGS_KW)
    normalizer = settings.normalizer(batch.loss_mask, seq_ids=batch.token_seq_ids(),
                                     num_sequences=batch.num_sequences)
    out = {}
    peak, seconds = _measure(lambda: out.update(backend.forward_backward(batch, settings, normalizer)))
    module = backend.engine.module if hasattr(backend, "engine") else backend.model
    if hasattr(backend, "engine"):
        from deepspeed.utils import safe_get_full_grad

        norms = {n: float(safe_get_full_grad(p).norm()) for n, p in module.named_parameters()}
    else:
        full = lambda g: g.full_tensor() if hasattr(g, "full_tensor") else g  # noqa: E731
        norms = {n: float(full(p.grad).norm()) for n, p in module.named_parameters()}
    return {"peak_mib": peak, "seconds": seconds, "loss": out["loss"], "grad_norms": norms}


def _tp_worker(rank, args, out_dir):
    import torch.distributed as dist

    from rl.backends.megatron.chunked_loss import copy_to_group, vocab_parallel_chunked_loss
    from rl.core.algorithms import LossSettings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n, rows = args.tokens, args.vocab // 2
    hidden = torch.randn(n, args.hidden, generator=g).requires_grad_()
    weight = torch.randn(args.vocab, args.hidden, generator=g).mul_(args.hidden ** -0.5)
    shard = weight[rank * rows:(rank + 1) * rows].clone().requires_grad_()
    del weight
    targets = torch.randint(0, args.vocab, (n,), generator=g)
    adv, mask = torch.randn(n, generator=g), torch.ones(n, dtype=torch.bool)
    old, seq_ids = torch.full((n,), -12.0), torch.arange(n) // (n // args.sequences)
    settings = LossSettings(**SETTINGS_KW)
    normalizer = settings.normalizer(mask, seq_ids=seq_ids, num_sequences=args.sequences)
    out = {}

    def step():
        loss, _ = vocab_parallel_chunked_loss(
            settings, copy_to_group(hidden, None), shard, targets, old, adv, mask, normalizer, vocab_start=rank * rows,
            vocab_size=args.vocab, ref_logprobs=old, seq_ids=seq_ids, num_sequences=args.sequences,
            chunk_size=args.chunk_size if args.fused else n)
        loss.backward()
        out["loss"] = float(loss)

    peak, seconds = _measure(step)
    result = {"peak_mib": peak, "seconds": seconds, "loss": out["loss"],
              "grad_norms": {"hidden": float(hidden.grad.norm()), f"weight{rank}": float(shard.grad.norm())}}
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def run_tp(args) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_tp_worker, args=(args, out_dir), nprocs=2)
        ranks = []
        for r in range(2):
            with open(os.path.join(out_dir, f"{r}.json")) as f:
                ranks.append(json.load(f))
    norms = {k: v for r in ranks for k, v in r["grad_norms"].items()}
    return {"peak_mib": max(r["peak_mib"] for r in ranks), "seconds": max(r["seconds"] for r in ranks),
            "loss": ranks[0]["loss"], "grad_norms": norms}


def _child(args, variant: str, fused: bool, model: str, port: int) -> dict:
    cmd = [sys.executable, "-m", "bench.kernels_training_memory", "--child", variant, "--model", model,
           "--port", str(port), "--tokens", str(args.tokens), "--vocab", str(args.vocab), "--hidden",
           str(args.hidden), "--sequences", str(args.sequences)] + (["--fused"] if fused else [])
    cmd += ["--chunk-size", str(args.chunk_size)] if args.chunk_size else []
    cmd += ["--gradient-checkpointing"] if args.gradient_checkpointing else []
    return memory_child(cmd, f"{variant} fused={fused}")


def _max_rel(a: dict, b: dict) -> float:
    return max(abs(a[k] - b[k]) / max(abs(b[k]), 1e-12) for k in b)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="tokens per chunk (trainer.policy.fused_kernel_chunk_size); default: ~64 MiB of logits")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="trainer.gradient_checkpointing=true in the HF strategies (the body's activations are "
                             "recomputed in backward instead of kept from the forward)")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=29655, help=argparse.SUPPRESS)
    parser.add_argument("--fused", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.variant = args.child
        print(json.dumps(run_tp(args) if args.child == "megatron-tp2" else run_hf(args)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        model = _model(args, directory)
        for i, variant in enumerate(args.variants.split(",")):
            logits = _child(args, variant, False, model, 29655 + 2 * i)
            chunked = _child(args, variant, True, model, 29656 + 2 * i)
            rows.append([variant, logits["peak_mib"], chunked["peak_mib"], chunked["peak_mib"] / logits["peak_mib"],
                         logits["seconds"], chunked["seconds"], logits["loss"], chunked["loss"],
                         _max_rel(chunked["grad_norms"], logits["grad_norms"])])
            print(f"{variant}: done", file=sys.stderr, flush=True)
    chunk = args.chunk_size or "default"
    checkpointing = "on" if args.gradient_checkpointing else "off"
    print(f"tokens {args.tokens}, vocabulary {args.vocab}, hidden {args.hidden}, chunk {chunk}, "
          f"gradient checkpointing {checkpointing}, fp32, CPU")
    print(format_table(["strategy", "logits MiB", "chunked MiB", "ratio", "logits s", "chunked s", "logits loss",
                        "chunked loss", "grad-norm rel diff"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
