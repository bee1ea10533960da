"""GPU kernel benchmark: achieved memory bandwidth of every kernel (CUDA and Triton) as a fraction of the device's
peak, and the fused GRPO loss (forward+backward; time and peak memory) against eager torch and, when importable,
Liger-Kernel.

    bazel run //bench:kernels_gpu -- [--tokens 8192 --vocab 32768 --hidden 4096 --peak_gbps 3350] [--json FILE]
        [--loss_shapes 4096x32768,16384x151936]
    python -m bench.kernels_gpu --dry_run      # on a CPU: every path at a tiny size, Triton under its interpreter

Needs a CUDA GPU (exits with a message otherwise) unless --dry_run, which runs the same code on the CPU at a tiny
size to catch a broken benchmark before device time is spent (its figures are not measurements). Peak bandwidth
comes from --peak_gbps, else a table of known devices, else a measured device-to-device copy; the copy's bandwidth
is printed too. Bytes per kernel are the compulsory traffic: logprobs forward reads the logits once, backward reads
them and writes the gradient, the fused loss reads them twice (two passes) and writes the gradient (`traffic`);
pack reads and writes the moved rows, unpack reads them and writes the whole padded batch, padding included. Times
are medians over CUDA-event-timed repeats after warm-up; peak memory is the allocator's peak during one call above
what was allocated before it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from bench.common import format_table

KNOWN_PEAK_GBPS = {
    "H200": 4800,
    "H100 NVL": 3900,
    "H100 PCIe": 2000,
    "H100": 3350,
    "A100-SXM4-80GB": 2039,
    "A100 80GB PCIe": 1935,
    "A100": 1555,
    "L40S": 864,
    "A10": 600,
}


DEVICE = "cuda"
"""Where the benchmark runs: "cpu" for --dry_run."""


def timed_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    if DEVICE != "cuda":
        repeats, warmup = 1, 0
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if DEVICE != "cuda":
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_mib(fn) -> float | str:
    """MiB the allocator's peak rose above what was allocated before one call of `fn`."""
    if DEVICE != "cuda":
        return "n/a (cpu)"
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def measured(fn, repeats: int, failures: tuple[type[Exception], ...] = (RuntimeError, ValueError)
             ) -> tuple[float | str, float | str]:
    """(ms, peak MiB) of `fn`, or the reason of one of its `failures` in both cells (a row that cannot run says
    why)."""
    try:
        return timed_ms(fn, repeats=repeats), peak_mib(fn)
    except failures as err:
        reason = f"n/a ({type(err).__name__}: {str(err).splitlines()[0][:160]})"
        return reason, reason


def copy_gbps() -> float:
    x = torch.empty(1 << 29, dtype=torch.uint8, device=DEVICE)
    y = torch.empty_like(x)
    ms = timed_ms(lambda: y.copy_(x))
    return 2 * x.numel() / ms / 1e6


def peak_gbps(override: float | None, measured: float) -> tuple[float, str]:
    if override:
        return override, "--peak_gbps"
    name = torch.cuda.get_device_name()
    for key, value in KNOWN_PEAK_GBPS.items():
        if key in name:
            return float(value), f"spec sheet ({key})"
    return measured, "measured copy"


LOGIT_PASSES = {"logprobs_fwd": 1, "logprobs_bwd": 2, "fused_loss": 3}
"""Logits-sized passes over memory of each row kernel (reads and writes of [N, V])."""


def traffic(kernel: str, *, logits_bytes: int = 0, moved_bytes: int = 0, padded_bytes: int = 0) -> int:
    """Compulsory bytes one call of `kernel` (rl.kernels.sizing's names) moves."""
    if kernel in LOGIT_PASSES:
        return LOGIT_PASSES[kernel] * logits_bytes
    return 2 * moved_bytes if kernel == "pack" else moved_bytes + padded_bytes


def _impls():
    from rl.kernels.cuda import ext
    from rl.kernels.cuda.loader import load
    from rl.kernels.triton import ops as triton_ops

    impls = {"triton": triton_ops}
    if DEVICE != "cuda":
        print("note: dry run: no CUDA rows (the extension takes CUDA tensors)")
    elif load() is not None:
        impls["cuda"] = ext
    else:
        print("note: rl_kernels_cuda.so not built (bazel build //rl/kernels/cuda:rl_kernels_cuda.so): no CUDA rows")
    return impls


def bandwidth_rows(args, peak: float) -> list[list[object]]:
    from rl.core.algorithms import LossSettings

    g = torch.Generator(device=DEVICE).manual_seed(0)
    n, v = args.tokens, args.vocab
    logits = torch.randn(n, v, device=DEVICE, generator=g, dtype=torch.bfloat16)
    targets = torch.randint(0, v, (n,), device=DEVICE, generator=g)
    rows_, width, features = (64, 2048, 1024) if DEVICE == "cuda" else (4, 64, 64)  # the interpreter is slow
    lengths = torch.randint(1, width + 1, (rows_,), device=DEVICE, generator=g, dtype=torch.int32)
    padded = torch.randn(rows_, width, features, device=DEVICE, generator=g, dtype=torch.bfloat16)
    settings = LossSettings(use_kl_loss=True, kl_estimator_type="k3")
    old, adv, ref = (torch.randn(n, device=DEVICE, generator=g) for _ in range(3))
    mask = torch.ones(n, dtype=torch.bool, device=DEVICE)
    normalizer = settings.normalizer(mask, seq_ids=torch.zeros(n, dtype=torch.long, device=DEVICE), num_sequences=1)
    seq_ids = torch.zeros(n, dtype=torch.long, device=DEVICE)
    rows = []
    sizes = dict(logits_bytes=logits.numel() * logits.element_size(),
                 moved_bytes=int(lengths.sum()) * features * padded.element_size(),
                 padded_bytes=padded.numel() * padded.element_size())
    for name, impl in _impls().items():
        packed = impl.pack(padded, lengths)
        lp_ent = lambda impl=impl: impl.token_logprobs_entropy(logits, targets)  # noqa: E731
        leaf = logits.detach().requires_grad_()
        out = impl.token_logprobs_entropy(leaf, targets)
        grads = (torch.ones(n, device=DEVICE), torch.ones(n, device=DEVICE))
        cases = [
            ("pack", lambda impl=impl: impl.pack(padded, lengths), traffic("pack", **sizes)),
            ("unpack", lambda impl=impl, packed=packed: impl.unpack(packed, lengths, width),
             traffic("unpack", **sizes)),
            ("logprobs fwd", lp_ent, traffic("logprobs_fwd", **sizes)),
            (
                "logprobs bwd",
                lambda out=out, leaf=leaf, grads=grads: torch.autograd.grad(out, leaf, grads, retain_graph=True),
                traffic("logprobs_bwd", **sizes),
            ),
            (
                "fused loss",
                lambda impl=impl: impl.fused_policy_loss(
                    settings,
                    logits,
                    targets,
                    old,
                    adv,
                    mask,
                    normalizer,
                    ref_logprobs=ref,
                    seq_ids=seq_ids,
                    num_sequences=1,
                ),
                traffic("fused_loss", **sizes),
            ),
        ]
        for op, fn, nbytes in cases:
            ms = timed_ms(fn)
            gbps = nbytes / ms / 1e6
            rows.append([op, name, ms, gbps, gbps / peak])
    return rows


def loss_rows(args, tokens: int, vocab: int) -> list[list[object]]:
    """Fused loss forward+backward from logits (ours vs eager), and from hidden states (chunked vs eager and Liger),
    at `tokens` x `vocab`: [path, implementation, ms, peak MiB] per row."""
    from rl.core.algorithms import LossSettings, compute_policy_loss
    from rl.kernels import ops
    from rl.kernels.reference.chunked import token_chunk

    g = torch.Generator(device=DEVICE).manual_seed(1)
    n, v, h = tokens, vocab, args.hidden
    settings = LossSettings(use_kl_loss=True, kl_estimator_type="k3", kl_loss_coef=0.01)
    logits = torch.randn(n, v, device=DEVICE, generator=g, dtype=torch.bfloat16)
    targets = torch.randint(0, v, (n,), device=DEVICE, generator=g)
    old, ref = (torch.randn(n, device=DEVICE, generator=g) * 0.1 - 10.4 for _ in range(2))
    adv = torch.randn(n, device=DEVICE, generator=g)
    mask = torch.ones(n, dtype=torch.bool, device=DEVICE)
    seq_ids = torch.arange(n, device=DEVICE) // args.seq_len
    num_seqs = n // args.seq_len
    normalizer = settings.normalizer(mask, seq_ids=seq_ids, num_sequences=num_seqs)
    common = dict(ref_logprobs=ref, seq_ids=seq_ids, num_sequences=num_seqs)

    def eager():
        leaf = logits.detach().requires_grad_()
        lp = torch.log_softmax(leaf.float(), -1).gather(1, targets[:, None]).squeeze(1)
        compute_policy_loss(settings, lp, old, adv, mask, normalizer, **common)[0].backward()

    def fused(kernels):
        def run():
            leaf = logits.detach().requires_grad_()
            ops.fused_policy_loss(settings, leaf, targets, old, adv, mask, normalizer, kernels=kernels, **common)[
                0
            ].backward()

        return run

    path = f"logits -> loss, {n} x {v}"
    rows = [[path, "eager torch", *measured(eager, 20)]]
    rows += [[path, f"fused {kernels}", *measured(fused(kernels), 20)] for kernels in ("triton", "cuda")]
    logits = None  # freed: the hidden-state paths' peaks are measured without it
    hidden = torch.randn(n, h, device=DEVICE, generator=g, dtype=torch.bfloat16) * 0.5
    weight = torch.randn(v, h, device=DEVICE, generator=g, dtype=torch.bfloat16) / h**0.5
    chunk = token_chunk(hidden, weight, None, 2 * hidden.element_size() * v)
    print(f"chunked loss at {n} x {v}: chunks of {chunk} tokens ({-(-n // chunk)} chunks)")

    def chunked():
        hl, wl = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
        ops.chunked_policy_loss(settings, hl, wl, targets, old, adv, mask, normalizer, **common)[0].backward()

    def eager_linear():
        hl, wl = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
        lp = torch.log_softmax((hl @ wl.T).float(), -1).gather(1, targets[:, None]).squeeze(1)
        compute_policy_loss(settings, lp, old, adv, mask, normalizer, **common)[0].backward()

    path = f"hidden -> loss, {n} x {v} x {h}"
    rows.append([path, "eager torch", *measured(eager_linear, 5)])
    rows.append([path, f"chunked (rl.kernels, {chunk} tokens a chunk)", *measured(chunked, 5)])
    rows.append([path, "Liger GRPO", *liger(hidden, weight, targets, adv, old, ref, args)])
    return rows


def liger(hidden, weight, targets, adv, old, ref, args) -> tuple[float | str, float | str]:
    """(ms, peak MiB) of Liger-Kernel's fused linear GRPO loss on the same tokens, one sequence a chunk (its
    default), or why it could not run."""
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
    except ImportError as err:
        reason = f"n/a (liger-kernel not importable: {err})"
        return reason, reason
    b = hidden.shape[0] // args.seq_len
    shape = (b, args.seq_len)
    # compiled on a GPU, as its users run it; eager on the CPU of a dry run (no compiler needed)
    loss_fn = LigerFusedLinearGRPOLoss(beta=0.01, use_ref_model=True, compiled=DEVICE == "cuda")

    def run():
        hl, wl = hidden.detach().view(*shape, -1).requires_grad_(), weight.detach().requires_grad_()
        out = loss_fn(
            hl,
            wl,
            targets.view(shape),
            torch.ones(shape, device=DEVICE),
            adv.view(shape)[:, 0],
            ref_per_token_logps=ref.view(shape),
            old_per_token_logps=old.view(shape),
        )
        (out[0] if isinstance(out, tuple) else out).backward()

    return measured(run, 5, (Exception,))  # the Liger API moves between versions: report, don't fail the benchmark


def loss_shapes(text: str | None, tokens: int, vocab: int) -> list[tuple[int, int]]:
    """"4096x32768,16384x151936" -> [(4096, 32768), (16384, 151936)]; without it, --tokens x --vocab."""
    if not text:
        return [(tokens, vocab)]
    shapes = []
    for part in text.split(","):
        n, _, v = part.strip().partition("x")
        if not (n.isdigit() and v.isdigit()):
            raise SystemExit(f"--loss_shapes: '{part}' is not TOKENSxVOCAB (e.g. 16384x151936)")
        shapes.append((int(n), int(v)))
    return shapes


DRY_RUN = {"tokens": 256, "vocab": 512, "hidden": 64, "seq_len": 64}
"""The sizes of --dry_run (the Triton interpreter runs a program at a time)."""


def start_dry_run(args, sizes: dict) -> None:
    """Switches this process to a CPU dry run: the benchmark's tensors on the CPU, Triton interpreted, `sizes` set
    on `args`."""
    global DEVICE
    DEVICE = "cpu"
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels' modules are first imported
    for key, value in sizes.items():
        setattr(args, key, value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--loss_shapes", default=None,
                        help="TOKENSxVOCAB,... for the loss tables (default: --tokens x --vocab)")
    parser.add_argument("--peak_gbps", type=float, default=None, help="device peak memory bandwidth in GB/s")
    parser.add_argument("--json", default=None, help="also write every figure to this JSON file")
    parser.add_argument("--dry_run", action="store_true",
                        help="run every path on the CPU at a tiny size (Triton interpreted); figures not measured")
    args = parser.parse_args(argv)
    if args.dry_run:
        start_dry_run(args, DRY_RUN)
        args.loss_shapes = f"{DRY_RUN['tokens']}x{DRY_RUN['vocab']}"
        print("dry run on the CPU: every path at a tiny size; the figures are not measurements")
    elif not torch.cuda.is_available():
        print("bench/kernels_gpu.py needs a CUDA GPU and none is visible; on CPU run bench/kernels_cpu_memory.py "
              "(or this script with --dry_run, to check that it runs)")
        return 2
    shapes = loss_shapes(args.loss_shapes, args.tokens, args.vocab)
    if DEVICE == "cuda":
        copy = copy_gbps()
        peak, source = peak_gbps(args.peak_gbps, copy)
        print(f"{torch.cuda.get_device_name()}: peak {peak:.0f} GB/s ({source}); device copy {copy:.0f} GB/s "
              f"({copy / peak:.0%} of peak)")
    else:
        copy, peak, source = float("nan"), args.peak_gbps or 1.0, "dry run"
    bandwidth = bandwidth_rows(args, peak)
    print(format_table(["op", "impl", "ms", "GB/s", "of peak"], bandwidth))
    print("goal: >= 70% of peak for the memory-bound kernels")
    rows = [row for tokens, vocab in shapes for row in loss_rows(args, tokens, vocab)]
    base = {row[0]: row for row in rows if row[1] == "eager torch"}
    table = [[*row, *against(row, base[row[0]])] for row in rows]
    shown = [[*row[:4], "-" if row[4] is None else f"{row[4]:.2f}x", "-" if row[5] is None else f"{row[5]:.2f}"]
             for row in table]
    print(format_table(["path", "impl", "ms fwd+bwd", "peak MiB", "speed-up vs eager", "memory / eager"], shown))
    if args.json:
        write_json(args, copy, peak, source, bandwidth, table)
    return 0


def against(row: list[object], eager: list[object]) -> list[float | None]:
    """[speed-up over eager, peak memory as a fraction of eager's] of a loss row, None where a figure is missing."""
    ratio = lambda a, b: a / b if isinstance(a, float) and isinstance(b, float) and b > 0 else None  # noqa: E731
    return [ratio(eager[2], row[2]), ratio(row[3], eager[3])]


def write_json(args, copy, peak, source, bandwidth, table) -> None:
    """The figures printed above, for reports: n/a cells stay strings (their reason)."""
    import json

    import triton

    figures = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "dry_run")},
        "peak_gbps": peak,
        "peak_source": source,
        "copy_gbps": copy,
        "bandwidth": [dict(zip(("op", "impl", "ms", "gbps", "of_peak"), row, strict=True)) for row in bandwidth],
        "loss": [dict(zip(("path", "impl", "ms", "peak_mib", "speedup_vs_eager", "memory_vs_eager"), row,
                          strict=True)) for row in table],
    }
    with open(args.json, "w") as f:
        json.dump(figures, f, indent=1)
    print(f"figures written to {args.json}")


if __name__ == "__main__":
    sys.exit(main())
