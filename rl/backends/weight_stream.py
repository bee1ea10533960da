"""Weights streamed over a process group of their own (`generator.weight_sync_backend` gloo or nccl): training rank 0
(group rank 0) broadcasts, bucket by bucket, to the engine actors (group ranks 1..E) that sit on devices of their
own. Every message is a broadcast from rank 0: a header (length, then the pickled layout of the bucket,
`shared_weights.layout`: name, dtype, shape and offset of each tensor, and the buffer's size; length 0 ends the
stream), then one flat byte buffer holding the tensors one after another.

The group is built from a TCPStore and the backend's ProcessGroup class directly, so it exists beside the training
workers' default group without touching it.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from rl.core.generation.shared_weights import fill, layout, unpack

TIMEOUT = timedelta(minutes=30)


def join_group(store: dist.Store, rank: int, world_size: int, backend: str) -> dist.ProcessGroup:
    """This process's member of the weight group, met at `store` (`rl.backends.dist.host_store` in training rank 0,
    `connect_store` elsewhere); collective: all members call it."""
    prefixed = dist.PrefixStore("weights", store)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(prefixed, rank, world_size)
    return dist.ProcessGroupGloo(prefixed, rank, world_size, TIMEOUT)


def _device(backend: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def _broadcast(group: dist.ProcessGroup, tensor: Tensor) -> None:
    group.broadcast(tensor, 0).wait()


def send_bucket(group: dist.ProcessGroup, backend: str, bucket: Iterable[tuple[str, Tensor]]) -> int:
    """Broadcasts one bucket; returns its payload bytes."""
    bucket = list(bucket)
    device = _device(backend)
    entries, size = layout(bucket)
    header = pickle.dumps((entries, size))
    _broadcast(group, torch.tensor([len(header)], dtype=torch.int64, device=device))
    _broadcast(group, torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device))
    flat = torch.zeros(size, dtype=torch.uint8, device=device)
    fill(flat, bucket, entries)
    _broadcast(group, flat)
    return size


def send_end(group: dist.ProcessGroup, backend: str) -> None:
    _broadcast(group, torch.zeros(1, dtype=torch.int64, device=_device(backend)))


def receive_buckets(group: dist.ProcessGroup, backend: str) -> Iterator[list[tuple[str, Tensor]]]:
    """The buckets rank 0 sends, until it ends the stream: (name, tensor) lists, the tensors on this member's
    device and in the sender's dtypes."""
    device = _device(backend)
    while True:
        length = torch.zeros(1, dtype=torch.int64, device=device)
        _broadcast(group, length)
        if int(length) == 0:
            return
        header = torch.empty(int(length), dtype=torch.uint8, device=device)
        _broadcast(group, header)
        entries, size = pickle.loads(header.cpu().numpy().tobytes())
        flat = torch.empty(size, dtype=torch.uint8, device=device)
        _broadcast(group, flat)
        yield unpack(flat, entries)
