"""Weight sync after a training step: the old full-state path against the bucketed one, fsdp2 on 2 gloo workers.

    PYTHONPATH=. python -m bench.weight_sync [--hidden 1024 --layers 12 --bucket_mb 256 --rounds 3]

Both paths end in rank 0 copying Hugging Face-named tensors into an HF generation engine's model (the receiver is
the same, so the difference is the gathering): `full`: `full_state_dict()` (torch's full state dict, gathered to
rank 0's CPU) then one `update_weights` with all of it, the path the HF engine still uses; `bucketed`:
`weight_buckets(bucket)` (one parameter gathered at a time) with one `update_weights` per bucket, the path the vllm
engine's actors are fed by. Reported per path: median seconds, seconds per GB of weights, and rank 0's resident-set
peak above its level before the sync (glibc's mmap threshold fixed at 128 KiB so freed tensors leave it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

from bench.common import ModelShape, format_table, free_port, save_model, status_kib


def _worker(rank: int, port: int, args, path: str, out: str) -> None:
    from rl.backends.base import ModelSpec
    from rl.backends.dist import init_distributed
    from rl.backends.registry import build_backend
    from rl.core.generation import build_engine

    torch.set_num_threads(1)
    info = init_distributed(rank, 2, "127.0.0.1", port)
    backend = build_backend("fsdp2", ModelSpec(path=path, role="policy", temperature=1.0), info)
    engine = build_engine("hf", path, path, device="cpu") if rank == 0 else None
    total = sum(p.numel() * p.element_size() for p in engine.model.parameters()) if engine else 0
    results: dict[str, list] = {"full": [], "bucketed": []}

    def full() -> None:
        state = backend.full_state_dict()
        if engine is not None:
            engine.update_weights(state.items())

    def bucketed() -> None:
        for bucket in backend.weight_buckets(args.bucket_mb << 20):
            if engine is not None and bucket:
                engine.update_weights(bucket)

    for _ in range(args.rounds):
        for name, fn in (("full", full), ("bucketed", bucketed)):
            torch.distributed.barrier()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            base, started = status_kib("VmRSS"), time.perf_counter()
            fn()
            torch.distributed.barrier()
            results[name].append((time.perf_counter() - started, (status_kib("VmHWM") - base) / 1024))
    if rank == 0:
        torch.save({"results": results, "bytes": total}, out)
    torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--bucket_mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.child:  # rerun with the fixed mmap threshold (read by glibc at start-up)
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
        sys.exit(subprocess.run([sys.executable, "-m", "bench.weight_sync", *sys.argv[1:], "--child"], env=env,
                                check=False).returncode)
    shape = ModelShape(hidden=args.hidden, layers=args.layers, heads=args.hidden // 64, intermediate=args.hidden * 3,
                       vocab_size=32000, max_positions=512)
    with tempfile.TemporaryDirectory() as directory:
        path = save_model(os.path.join(directory, "model"), shape)
        out = os.path.join(directory, "result.pt")
        mp.spawn(_worker, args=(free_port(), args, path, out), nprocs=2)
        data = torch.load(out)
    gb = data["bytes"] / 1e9
    rows = []
    for name, samples in data["results"].items():
        seconds = statistics.median(s for s, _ in samples)
        rows.append([name, seconds, seconds / gb, max(m for _, m in samples)])
    print(f"{shape.describe()}: {gb:.2f} GB of fp32 weights, fsdp2 on 2 gloo workers, bucket {args.bucket_mb} MiB, "
          f"median of {args.rounds}")
    print(format_table(["path", "s", "s per GB", "rank-0 peak MiB"], rows))


if __name__ == "__main__":
    main()
