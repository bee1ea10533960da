"""GPU kernel benchmark: achieved memory bandwidth of every kernel (CUDA and Triton) as a fraction of the device's
peak, and the fused GRPO loss (forward+backward) against eager torch and, when importable, Liger-Kernel.

    bazel run //bench:kernels_gpu -- [--tokens 8192 --vocab 32768 --hidden 4096 --peak_gbps 3350] [--json FILE]
    python -m bench.kernels_gpu --help

Needs a CUDA GPU (exits with a message otherwise). Peak bandwidth comes from --peak_gbps, else a table of known
devices, else a measured device-to-device copy; the copy's bandwidth is printed too. Bytes per kernel are the
compulsory traffic: logprobs forward reads the logits once, backward reads them and writes the gradient, the fused
loss reads them twice (two passes) and writes the gradient, pack/unpack read and write the moved rows. Times are
medians over CUDA-event-timed repeats after warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys

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


def timed_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_gbps() -> float:
    x = torch.empty(1 << 29, dtype=torch.uint8, device="cuda")
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


def _impls():
    from rl.kernels.cuda import ext
    from rl.kernels.cuda.loader import load
    from rl.kernels.triton import ops as triton_ops

    impls = {"triton": triton_ops}
    if load() is not None:
        impls["cuda"] = ext
    else:
        print("note: rl_kernels_cuda.so not built (bazel build //rl/kernels/cuda:rl_kernels_cuda.so): no CUDA rows")
    return impls


def bandwidth_rows(args, peak: float) -> list[list[object]]:
    from rl.core.algorithms import LossSettings

    g = torch.Generator(device="cuda").manual_seed(0)
    n, v = args.tokens, args.vocab
    logits = torch.randn(n, v, device="cuda", generator=g, dtype=torch.bfloat16)
    targets = torch.randint(0, v, (n,), device="cuda", generator=g)
    lengths = torch.randint(1, 2049, (64,), device="cuda", generator=g, dtype=torch.int32)
    padded = torch.randn(64, 2048, 1024, device="cuda", generator=g, dtype=torch.bfloat16)
    settings = LossSettings(use_kl_loss=True, kl_estimator_type="k3")
    old, adv, ref = (torch.randn(n, device="cuda", generator=g) for _ in range(3))
    mask = torch.ones(n, dtype=torch.bool, device="cuda")
    normalizer = settings.normalizer(mask, seq_ids=torch.zeros(n, dtype=torch.long, device="cuda"), num_sequences=1)
    seq_ids = torch.zeros(n, dtype=torch.long, device="cuda")
    rows = []
    elem = logits.element_size()
    moved = int(lengths.sum()) * 1024 * padded.element_size()
    for name, impl in _impls().items():
        packed = impl.pack(padded, lengths)
        lp_ent = lambda impl=impl: impl.token_logprobs_entropy(logits, targets)  # noqa: E731
        leaf = logits.detach().requires_grad_()
        out = impl.token_logprobs_entropy(leaf, targets)
        grads = (torch.ones(n, device="cuda"), torch.ones(n, device="cuda"))
        cases = [
            ("pack", lambda impl=impl: impl.pack(padded, lengths), 2 * moved),
            ("unpack", lambda impl=impl, packed=packed: impl.unpack(packed, lengths, 2048), 2 * moved),
            ("logprobs fwd", lp_ent, n * v * elem),
            (
                "logprobs bwd",
                lambda out=out, leaf=leaf, grads=grads: torch.autograd.grad(out, leaf, grads, retain_graph=True),
                2 * n * v * elem,
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
                3 * n * v * elem,
            ),
        ]
        for op, fn, nbytes in cases:
            ms = timed_ms(fn)
            gbps = nbytes / ms / 1e6
            rows.append([op, name, ms, gbps, gbps / peak])
    return rows


def loss_rows(args) -> list[list[object]]:
    """Fused loss forward+backward from logits (ours vs eager), and from hidden states (chunked vs Liger)."""
    from rl.core.algorithms import LossSettings, compute_policy_loss
    from rl.kernels import ops

    g = torch.Generator(device="cuda").manual_seed(1)
    n, v, h = args.tokens, args.vocab, args.hidden
    settings = LossSettings(use_kl_loss=True, kl_estimator_type="k3", kl_loss_coef=0.01)
    logits = torch.randn(n, v, device="cuda", generator=g, dtype=torch.bfloat16)
    targets = torch.randint(0, v, (n,), device="cuda", generator=g)
    old, ref = (torch.randn(n, device="cuda", generator=g) * 0.1 - 10.4 for _ in range(2))
    adv = torch.randn(n, device="cuda", generator=g)
    mask = torch.ones(n, dtype=torch.bool, device="cuda")
    seq_ids = torch.arange(n, device="cuda") // args.seq_len
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

    rows = [["logits -> loss", "eager torch", timed_ms(eager)]]
    for kernels in ("triton", "cuda"):
        try:
            rows.append(["logits -> loss", f"fused {kernels}", timed_ms(fused(kernels))])
        except RuntimeError as err:
            rows.append(["logits -> loss", f"fused {kernels}", f"n/a ({err})"])
    hidden = torch.randn(n, h, device="cuda", generator=g, dtype=torch.bfloat16) * 0.5
    weight = torch.randn(v, h, device="cuda", generator=g, dtype=torch.bfloat16) / h**0.5

    def chunked():
        hl, wl = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
        ops.chunked_policy_loss(settings, hl, wl, targets, old, adv, mask, normalizer, **common)[0].backward()

    def eager_linear():
        hl, wl = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
        lp = torch.log_softmax((hl @ wl.T).float(), -1).gather(1, targets[:, None]).squeeze(1)
        compute_policy_loss(settings, lp, old, adv, mask, normalizer, **common)[0].backward()

    rows.append(["hidden -> loss", "eager torch", timed_ms(eager_linear, repeats=5)])
    rows.append(["hidden -> loss", "chunked (rl.kernels)", timed_ms(chunked, repeats=5)])
    rows.append(["hidden -> loss", "Liger GRPO", liger_ms(hidden, weight, targets, adv, old, ref, args)])
    return rows


def liger_ms(hidden, weight, targets, adv, old, ref, args):
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
    except ImportError as err:
        return f"n/a (liger-kernel not importable: {err})"
    b = args.tokens // args.seq_len
    shape = (b, args.seq_len)
    loss_fn = LigerFusedLinearGRPOLoss(beta=0.01, use_ref_model=True)

    def run():
        hl, wl = hidden.detach().view(*shape, -1).requires_grad_(), weight.detach().requires_grad_()
        out = loss_fn(
            hl,
            wl,
            targets.view(shape),
            torch.ones(shape, device="cuda"),
            adv.view(shape)[:, 0],
            ref_per_token_logps=ref.view(shape),
            old_per_token_logps=old.view(shape),
        )
        (out[0] if isinstance(out, tuple) else out).backward()

    try:
        return timed_ms(run, repeats=5)
    except Exception as err:  # the Liger API moves between versions: report, don't fail the benchmark
        return f"n/a ({type(err).__name__}: {err})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--peak_gbps", type=float, default=None, help="device peak memory bandwidth in GB/s")
    parser.add_argument("--json", default=None, help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/kernels_gpu.py needs a CUDA GPU and none is visible; on CPU run bench/kernels_cpu_memory.py")
        return 2
    measured = copy_gbps()
    peak, source = peak_gbps(args.peak_gbps, measured)
    print(
        f"{torch.cuda.get_device_name()}: peak {peak:.0f} GB/s ({source}); device copy {measured:.0f} GB/s "
        f"({measured / peak:.0%} of peak)"
    )
    bandwidth = bandwidth_rows(args, peak)
    print(format_table(["op", "impl", "ms", "GB/s", "of peak"], bandwidth))
    print("goal: >= 70% of peak for the memory-bound kernels")
    rows = loss_rows(args)
    base = {row[0]: row[2] for row in rows if row[1] == "eager torch"}
    table = [[*row, f"{base[row[0]] / row[2]:.2f}x" if isinstance(row[2], float) else "-"] for row in rows]
    print(format_table(["path", "impl", "ms fwd+bwd", "speed-up vs eager"], table))
    if args.json:
        write_json(args, measured, peak, source, bandwidth, rows, base)
    return 0


def write_json(args, measured, peak, source, bandwidth, rows, base) -> None:
    """The figures printed above, for reports: n/a cells stay strings (their reason)."""
    import json

    import triton

    figures = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "peak_gbps": peak,
        "peak_source": source,
        "copy_gbps": measured,
        "bandwidth": [dict(zip(("op", "impl", "ms", "gbps", "of_peak"), row, strict=True)) for row in bandwidth],
        "loss": [
            {"path": row[0], "impl": row[1], "ms": row[2],
             "speedup_vs_eager": base[row[0]] / row[2] if isinstance(row[2], float) else None}
            for row in rows
        ],
    }
    with open(args.json, "w") as f:
        json.dump(figures, f, indent=1)
    print(f"figures written to {args.json}")


if __name__ == "__main__":
    sys.exit(main())
