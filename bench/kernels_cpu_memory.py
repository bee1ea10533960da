"""Peak memory and time of token logprobs + GRPO loss (forward and backward) on CPU: the chunked path
(`rl.kernels.ops.chunked_policy_loss`, hidden states + LM-head weight, never the whole [N, V] logits) against plain
eager torch (`logits = hidden @ W.T`, `log_softmax(logits).gather`, `compute_policy_loss`).

    bazel run //bench:kernels_cpu_memory -- [--tokens 8192 --vocab 32768 --hidden 1024 --rounds 2 --threads 0]
    python -m bench.kernels_cpu_memory --help

Each variant runs in a fresh subprocess. Peak memory is the growth of the process's peak resident set (VmHWM, reset
through /proc/self/clear_refs once the inputs exist) over its resident set at that moment, during the first
forward+backward: it sees every allocation torch makes, which tracemalloc does not. The variants take turns for
`--rounds` rounds (so load from other processes hits both alike); each round's subprocess times `--repeats`
forward+backward passes; the table shows medians of wall time and of the process's CPU time. Both variants use
the same inputs (GRPO clip loss, k3 KL term, token_mean) and their losses are compared.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time

import torch

from bench.common import format_table, median, set_threads, status_kib

VARIANTS = ("eager", "chunked")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set (Linux >= 4.0)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _inputs(tokens: int, vocab: int, hidden: int, seq_len: int):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g).mul_(1.0 / math.sqrt(hidden))
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    old = torch.randn(tokens, generator=g).mul_(0.1).sub_(math.log(vocab))
    ref = torch.randn(tokens, generator=g).mul_(0.1).sub_(math.log(vocab))
    adv = torch.randn(tokens, generator=g)
    mask = torch.rand(tokens, generator=g) > 0.1
    seq_ids = torch.arange(tokens) // seq_len
    return h.requires_grad_(), w.requires_grad_(), targets, old, ref, adv, mask, seq_ids


def _step(variant, settings, normalizer, h, w, targets, old, ref, adv, mask, seq_ids, num_seqs):
    from rl.core.algorithms import compute_policy_loss
    from rl.kernels import ops

    if variant == "eager":
        logits = h @ w.T
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
        loss, _ = compute_policy_loss(
            settings, logprobs, old, adv, mask, normalizer, ref_logprobs=ref, seq_ids=seq_ids, num_sequences=num_seqs
        )
    else:
        loss, _ = ops.chunked_policy_loss(
            settings,
            h,
            w,
            targets,
            old,
            adv,
            mask,
            normalizer,
            ref_logprobs=ref,
            seq_ids=seq_ids,
            num_sequences=num_seqs,
        )
    loss.backward()
    return float(loss.detach())


def run_variant(args) -> dict:
    from rl.core.algorithms import LossSettings

    set_threads(args.threads)
    settings = LossSettings(use_kl_loss=True, kl_estimator_type="k3", kl_loss_coef=0.01)
    h, w, targets, old, ref, adv, mask, seq_ids = _inputs(args.tokens, args.vocab, args.hidden, args.seq_len)
    num_seqs = int(seq_ids[-1]) + 1
    normalizer = settings.normalizer(mask, seq_ids=seq_ids, num_sequences=num_seqs)
    times, cpu, peak_mib, loss = [], [], None, None
    for rep in range(args.repeats):
        h.grad = w.grad = None
        if rep == 0:
            base = status_kib("VmRSS")
            _reset_peak()
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        loss = _step(args.variant, settings, normalizer, h, w, targets, old, ref, adv, mask, seq_ids, num_seqs)
        times.append(time.perf_counter() - start)
        cpu.append(_cpu_seconds() - cpu_start)
        if rep == 0:
            peak_mib = (status_kib("VmHWM") - base) / 1024
    return {
        "variant": args.variant,
        "peak_mib": peak_mib,
        "seconds": times,
        "cpu_seconds": cpu,
        "loss": loss,
        "grad_w_norm": float(w.grad.norm()),
        "grad_h_norm": float(h.grad.norm()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--seq_len", type=int, default=512, help="tokens per sequence (for the sequence ids)")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes per subprocess")
    parser.add_argument("--rounds", type=int, default=2, help="subprocesses per variant, taking turns")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per variant; 0 = all cores")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args)))
        return 0
    runs = {variant: [] for variant in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            cmd = [
                sys.executable,
                "-m",
                "bench.kernels_cpu_memory",
                *(argv if argv is not None else sys.argv[1:]),
                "--variant",
                variant,
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs[variant].append(json.loads(out.strip().splitlines()[-1]))
    results = {
        variant: {
            **rs[0],
            "peak_mib": max(r["peak_mib"] for r in rs),
            "seconds": median([t for r in rs for t in r["seconds"]]),
            "cpu_seconds": median([t for r in rs for t in r["cpu_seconds"]]),
        }
        for variant, rs in runs.items()
    }
    eager, chunked = results["eager"], results["chunked"]
    print(
        f"token logprobs + GRPO loss, forward+backward: {args.tokens} tokens x {args.vocab} vocab, "
        f"hidden {args.hidden}, fp32, {set_threads(args.threads)} threads"
    )
    rows = [[v, r["peak_mib"], r["seconds"], r["cpu_seconds"], r["loss"]] for v, r in results.items()]
    print(format_table(["variant", "peak MiB", "wall s", "CPU s", "loss"], rows))
    print(f"peak memory ratio chunked/eager: {chunked['peak_mib'] / eager['peak_mib']:.3f} (goal <= 0.25)")
    print(
        f"time ratio chunked/eager: {chunked['seconds'] / eager['seconds']:.3f} wall, "
        f"{chunked['cpu_seconds'] / eager['cpu_seconds']:.3f} CPU (goal <= 1.0)"
    )
    for key in ("loss", "grad_w_norm", "grad_h_norm"):
        rel = abs(chunked[key] - eager[key]) / max(abs(eager[key]), 1e-12)
        print(f"{key}: eager {eager[key]:.6g}, chunked {chunked[key]:.6g} (relative difference {rel:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
