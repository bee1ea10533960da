"""The policy's weights in buckets of Hugging Face-named tensors, for the generation engines after each step.

`TrainingBackend.weight_buckets(bucket_bytes)` yields lists of (name, full CPU tensor) of about `bucket_bytes` each on
rank 0 (the other ranks take part in each gather and keep nothing). `bucketed` cuts any stream of named tensors into
such lists. Every built-in strategy streams, gathering one piece at a time (fsdp2 a parameter, fsdp a unit,
DeepSpeed ZeRO-3 a group of parameters, megatron a decoder layer), so no rank holds more than a bucket of full
tensors beyond its own shard.

`device_buckets(bucket_bytes)`, where a strategy has it (fsdp2, fsdp, deepspeed): the same buckets on every rank,
each tensor on that rank's device (what each gather leaves on every rank anyway), so that every rank sharing a
device with engine workers can feed them by handle without a copy through host memory (`TrainingWorker.share_weights`).
`gathers_on_every_rank` tells whether a backend has it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from torch import Tensor

Bucket = list[tuple[str, Tensor]]


def bucketed(named: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> Iterator[Bucket]:
    """Consecutive lists of (name, tensor) whose bytes reach `bucket_bytes` (the last may be smaller; a tensor
    larger than a bucket is a bucket of its own)."""
    bucket: Bucket = []
    size = 0
    for name, tensor in named:
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def rank0_buckets(named: Iterable[tuple[str, Tensor]], bucket_bytes: int, is_main: bool) -> Iterator[Bucket]:
    """`bucketed(named)` on rank 0. The other ranks only run `named` through (producing each item is a collective
    they take part in; they yield no items) and yield no buckets."""
    if is_main:
        yield from bucketed(named, bucket_bytes)
    else:
        for _ in named:
            pass


def gathers_on_every_rank(backend) -> bool:
    """Whether `backend` yields its buckets on every rank (`device_buckets`)."""
    return callable(getattr(backend, "device_buckets", None))


def bucket_bytes(bucket: Bucket) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)
