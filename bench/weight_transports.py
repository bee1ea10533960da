"""Weight sync into a vLLM engine on the training worker's device: buckets handed over as tensors against buckets
shared by handle, in one run.

    PYTHONPATH=. python -m bench.weight_transports [--hidden 1024 --layers 12 --bucket_mb 256 --rounds 3]

One fsdp2 worker (world size 1; a GPU when there is one) and a vllm engine on the same device. Each round sends the
worker's `weight_buckets` to the engine:
- `tensors`: `engine.update_weights(bucket)`, where the `ray` transport ends (the bucket written to a safetensors
  file in /dev/shm that the vLLM workers load); Ray's object store, which that transport adds before it, is left out.
- `handles`: the `ipc` transport (`TrainingWorker.share_weights`): the bucket laid out in one shared buffer (/dev/shm
  on CPU, CUDA IPC on a GPU), the vLLM workers mapping it and loading from it in place.
- `none (gather only)`: the buckets made and dropped, what every transport pays before it sends.
Reported: median seconds per sync and seconds per GB of weights. The GPU goal is a 1.5B model (`--hidden 1536
--layers 28 --intermediate 8960 --heads 12`) in under 1 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from bench.common import ModelShape, format_table, free_port, save_model


def _send_handles(engine, bucket, device) -> None:
    from rl.core.generation.shared_weights import shared

    with shared(bucket, device) as (handles, entries, _):
        engine.load_shared(handles, entries)


def run(args, path: str) -> tuple[list[list[object]], float]:
    from rl.backends.base import ModelSpec
    from rl.backends.dist import init_distributed
    from rl.backends.registry import build_backend
    from rl.core.generation import build_engine

    info = init_distributed(0, 1, "127.0.0.1", free_port())
    backend = build_backend("fsdp2", ModelSpec(path=path, role="policy", temperature=1.0), info)
    engine = build_engine("vllm", path, path, device=info.device.type, gpu_memory_utilization=args.memory,
                          max_model_len=256)
    total = sum(p.numel() * p.element_size() for p in backend.model.parameters())
    senders = {"none (gather only)": lambda bucket: None,
               "tensors": engine.update_weights,
               "handles": lambda bucket: _send_handles(engine, bucket, info.device)}
    seconds: dict[str, list[float]] = {name: [] for name in senders}
    for _ in range(args.rounds):
        for name, send in senders.items():
            started = time.perf_counter()
            for bucket in backend.weight_buckets(args.bucket_mb << 20):
                send(bucket)
            seconds[name].append(time.perf_counter() - started)
    gb = total / 1e9
    rows = [[name, statistics.median(s), statistics.median(s) / gb] for name, s in seconds.items()]
    return rows, gb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=None, help="default: hidden / 64")
    parser.add_argument("--intermediate", type=int, default=None, help="default: 3 x hidden")
    parser.add_argument("--bucket_mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory", type=float, default=0.3, help="the engine's gpu_memory_utilization")
    args = parser.parse_args()
    shape = ModelShape(hidden=args.hidden, layers=args.layers, heads=args.heads or args.hidden // 64,
                       intermediate=args.intermediate or args.hidden * 3, vocab_size=32000, max_positions=512)
    with tempfile.TemporaryDirectory() as directory:
        rows, gb = run(args, save_model(os.path.join(directory, "model"), shape))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{shape.describe()}: {gb:.2f} GB of fp32 weights, fsdp2 worker and vllm engine on {device}, bucket "
          f"{args.bucket_mb} MiB, median of {args.rounds}")
    print(format_table(["transport", "s", "s per GB"], rows))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
