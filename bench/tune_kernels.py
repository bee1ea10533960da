"""Block-size tuning of the Triton kernels on this GPU: every candidate launch (rl.kernels.sizing.
candidate_launches) of each kernel is timed at each size, and the fastest is recorded per device, kernel and size in
the launch record the kernels read at run time (rl/kernels/launches.py), beside the default launch's figure.

    python -m bench.tune_kernels --record rl/kernels/launch_configs.json [--vocabs 32768,151936] [--features 1,4096]
        [--tokens 8192] [--budget_s 150]
    python -m bench.tune_kernels --dry_run --record /tmp/launches.json   # on a CPU: Triton interpreted, tiny sizes

Bandwidth is each call's compulsory traffic (bench/kernels_gpu.py's `traffic`) over its median time, as a fraction
of the device's peak. Before a candidate is timed, its results are compared bit for bit with the default launch's
on inputs whose every sum is exact in any order (logits of 0 and -200: each softmax term is exactly 1 or 0), so a
launch that computes something else (a miscompiled warp count, a block that skips columns) is reported and never
recorded; the tests check each recordable block shape against the torch reference on random inputs. With
--budget_s spent, the remaining candidates are left out and the record says so.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch

from bench import kernels_gpu
from bench.common import format_table

CHECK_ROWS = 256
"""Rows of the exact-sum logits each candidate is checked on (its results do not depend on how many)."""

DRY_RUN = {"tokens": 8, "vocabs": "300", "features": "1,20", "rows": 4, "width": 40}
"""The sizes of --dry_run (the Triton interpreter runs a program at a time)."""


def row_case(kernel: str, tokens: int, vocab: int, exact: bool):
    """(call(launch) -> outputs, logits bytes) of a row kernel on bf16 logits: random ones to time, or `exact`
    ones (0 or -200, each row with live columns in every block) whose results cannot depend on summation order."""
    from rl.core.algorithms import LossSettings
    from rl.kernels.reference.policy_terms import plan_loss
    from rl.kernels.triton import ops as tri

    device = kernels_gpu.DEVICE
    g = torch.Generator(device=device).manual_seed(0)
    if exact:
        live = torch.rand(tokens, vocab, device=device, generator=g) < 0.5
        logits = torch.where(live, 0.0, -200.0).to(torch.bfloat16)
    else:
        logits = torch.randn(tokens, vocab, device=device, generator=g).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (tokens,), device=device, generator=g)
    lp, ent, lse = tri.logprobs_forward(logits, targets, 1.0)
    ones = torch.ones(tokens, device=device)
    settings = LossSettings(use_kl_loss=True, kl_estimator_type="k3", kl_loss_coef=0.01, use_entropy_loss=True)
    mask = torch.ones(tokens, dtype=torch.bool, device=device)
    seq_ids = torch.zeros(tokens, dtype=torch.long, device=device)
    plan = plan_loss(settings, settings.normalizer(mask, seq_ids=seq_ids, num_sequences=1), mask, seq_ids, 1)
    old, ref = lp - 0.1, lp + 0.1
    calls = {
        "logprobs_fwd": lambda cfg: tri.logprobs_forward(logits, targets, 1.0, launch=cfg),
        "logprobs_bwd": lambda cfg: (tri.logprobs_backward(logits, targets, 1.0, lse, ent, ones, ones, launch=cfg),),
        "fused_loss": lambda cfg: tri.loss_forward(logits, targets, old, ones, ref, plan, 1.0, launch=cfg),
    }
    return calls[kernel], {"logits_bytes": logits.numel() * logits.element_size()}


def packing_case(kernel: str, features: int, rows: int, width: int):
    """(call(launch) -> outputs, bytes) of pack or unpack over `rows` sequences of up to `width` positions."""
    from rl.kernels.triton import ops as tri

    device = kernels_gpu.DEVICE
    g = torch.Generator(device=device).manual_seed(0)
    lengths = torch.randint(1, width + 1, (rows,), device=device, generator=g, dtype=torch.int32)
    shape = (rows, width) if features == 1 else (rows, width, features)
    padded = torch.randn(shape, device=device, generator=g).to(torch.bfloat16)
    packed = tri.pack(padded, lengths)
    sizes = {"moved_bytes": packed.numel() * packed.element_size(),
             "padded_bytes": padded.numel() * padded.element_size()}
    if kernel == "pack":
        return (lambda cfg: (tri.pack(padded, lengths, launch=cfg),)), sizes
    return (lambda cfg: (tri.unpack(packed, lengths, width, launch=cfg),)), sizes


def same(got, want) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def tune(kernel: str, size: int, args, peak: float, deadline: float):
    """(best launch with its figures, the default's GB/s, candidates timed, candidates refused) of one kernel at
    one size."""
    from rl.kernels.sizing import ROW_KERNELS, candidate_launches, default_launch

    default = default_launch(kernel, size)
    candidates = [default] + [c for c in candidate_launches(kernel, size) if c != default]
    if kernel in ROW_KERNELS:
        timed_call, sizes = row_case(kernel, args.tokens, size, exact=False)
        check_call, _ = row_case(kernel, min(args.tokens, CHECK_ROWS), size, exact=True)
    else:
        timed_call, sizes = packing_case(kernel, size, args.rows, args.width)
        check_call = timed_call
    nbytes = kernels_gpu.traffic(kernel, **sizes)
    want = check_call(default)
    results, refused = [], []
    for cfg in candidates:
        if results and time.monotonic() > deadline:
            break
        if not same(check_call(cfg), want):
            refused.append(cfg)
            continue
        ms = kernels_gpu.timed_ms(lambda cfg=cfg: timed_call(cfg))
        results.append((nbytes / ms / 1e6, cfg))
    default_gbps = results[0][0]
    gbps, best = max(results, key=lambda r: r[0])
    figures = {"gbps": gbps, "of_peak": gbps / peak, "default_gbps": default_gbps,
               "default_of_peak": default_gbps / peak}
    figures = {key: float(f"{value:.4g}") for key, value in figures.items()}
    return {**best, **figures}, len(results), len(candidates), refused


def sizes_of(text: str, flag: str) -> list[int]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values or not all(v.isdigit() and int(v) > 0 for v in values):
        raise SystemExit(f"{flag}: '{text}' is not a comma-separated list of positive sizes (e.g. 32768,151936)")
    return [int(v) for v in values]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabs", default="32768,151936", help="vocabulary sizes of the row kernels")
    parser.add_argument("--features", default="1,4096", help="features per position of pack and unpack")
    parser.add_argument("--tokens", type=int, default=8192, help="rows of logits the row kernels are timed on")
    parser.add_argument("--rows", type=int, default=64, help="sequences pack and unpack are timed on")
    parser.add_argument("--width", type=int, default=2048, help="padded width of those sequences")
    parser.add_argument("--peak_gbps", type=float, default=None, help="device peak memory bandwidth in GB/s")
    parser.add_argument("--budget_s", type=float, default=None, help="stop timing candidates after this long")
    parser.add_argument("--record", default=None, help="write the fastest launches into this launch record")
    parser.add_argument("--dry_run", action="store_true",
                        help="run on the CPU at tiny sizes (Triton interpreted); figures not measured")
    args = parser.parse_args(argv)
    if args.dry_run:
        kernels_gpu.start_dry_run(args, DRY_RUN)
        print("dry run on the CPU: tiny sizes, Triton interpreted; the figures are not measurements")
    elif not torch.cuda.is_available():
        print("bench/tune_kernels.py needs a CUDA GPU and none is visible (--dry_run checks that it runs on a CPU)")
        return 2
    vocabs, features = sizes_of(args.vocabs, "--vocabs"), sizes_of(args.features, "--features")
    import triton

    from rl.kernels import launches
    from rl.kernels.sizing import PACK_KERNELS, ROW_KERNELS, next_power_of_2

    if kernels_gpu.DEVICE == "cuda":
        device = torch.cuda.get_device_name()
        peak, source = kernels_gpu.peak_gbps(args.peak_gbps, kernels_gpu.copy_gbps())
    else:
        device, peak, source = "cpu", args.peak_gbps or 1.0, "dry run"
    print(f"{device}: peak {peak:.0f} GB/s ({source})")
    start = time.monotonic()
    deadline = start + args.budget_s if args.budget_s is not None else float("inf")
    work = [(k, v) for k in ROW_KERNELS for v in vocabs] + [(k, f) for k in PACK_KERNELS for f in features]
    recorded: dict[str, dict[str, dict]] = {}
    rows, partial, failed = [], False, []
    for kernel, size in work:
        best, timed, total, refused = tune(kernel, size, args, peak, deadline)
        partial |= timed + len(refused) < total
        failed += [f"{kernel} at {size}: {cfg} differs from the default launch" for cfg in refused]
        recorded.setdefault(kernel, {})[str(next_power_of_2(size))] = best
        launch = ", ".join(f"{k}={v}" for k, v in best.items() if k not in launches.FIGURES)
        rows.append([kernel, size, f"{best['default_of_peak']:.0%}", launch, f"{best['of_peak']:.0%}",
                     f"{best['gbps'] / best['default_gbps']:.2f}x", f"{timed}/{total}"])
    print(format_table(["kernel", "size", "default (of peak)", "fastest launch", "of peak", "vs default", "timed"],
                       rows))
    for line in failed:
        print(f"REFUSED: {line}")
    if partial:
        print(f"--budget_s {args.budget_s:g} was spent: some candidates were not timed (column 'timed')")
    if args.record:
        measured = {"triton": triton.__version__, "torch": torch.__version__, "cuda": torch.version.cuda,
                    "date": datetime.date.today().isoformat(), "peak_gbps": peak, "peak_source": source,
                    "tokens": args.tokens, "rows": args.rows, "width": args.width, "partial": partial}
        launches.save(args.record, device, measured, recorded)
        print(f"launches of {device} written to {args.record} in {time.monotonic() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
