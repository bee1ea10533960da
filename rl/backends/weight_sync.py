"""The policy's weights in buckets of Hugging Face-named tensors, for the generation engines after each step.

`TrainingBackend.weight_buckets(bucket_bytes)` yields lists of (name, full CPU tensor) of about `bucket_bytes` each on
rank 0 (and empty lists, in step, on the other ranks: producing a bucket is collective). `bucketed` cuts any stream of
named tensors into such lists; a backend that can gather one parameter at a time (fsdp2) streams, so no rank ever
holds more than one bucket of full tensors beyond its shard.
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


def bucket_bytes(bucket: Bucket) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)
