"""Buckets of weights handed between processes of one machine by handle (`generator.weight_sync_backend=ipc`).

The sender lays a bucket out in one flat byte buffer (`layout`, `SharedBuffer.fill`) and shares it: a buffer on a
GPU through CUDA IPC, one in host memory as a file in /dev/shm. Only the handle and the layout travel (through Ray
and vLLM's `collective_rpc`); a receiver maps the buffer (`open_shared`) and views its tensors in place (`unpack`),
so the bytes are copied twice in all: into the buffer, and into the engine's weights.

A handle opens only on the device it lives on, so handles are keyed by `device_key` (the GPU's UUID, or the host's
boot id) and a receiver takes the one for its own device (`handle_for`). Every training rank that shares a device
with engine workers shares its own copy of each bucket there (`rl.trainer.rollout.engine_feeds` decides which rank feeds
which worker), so an engine's call may carry handles on several devices.

Emulated devices (`EMULATE_ENV=1`, for tests on a CPU machine): host memory then counts as one device per placement
slot (`device_key(..., slot)`): a training rank's slot is its rank, an engine worker's the slot the placement gave
its engine (`SLOT_ENV`) plus its rank within the engine (`engine_worker_slot`). Only the keys change; the bytes still
go through /dev/shm.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

EMULATE_ENV = "RL_EMULATED_DEVICES"  # "1": on a CPU machine, each placement slot is a device of its own
SLOT_ENV = "RL_DEVICE_SLOT"  # set on a colocated engine actor: the slot of its first worker (`placement.engine_slots`)
ALIGN = 16  # each tensor starts at a multiple of this in the buffer, so it can be viewed in its dtype in place

# (name, dtype without "torch.", shape, byte offset in the buffer); several names may share one offset (tied weights)
Entry = tuple[str, str, tuple[int, ...], int]


def padded(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def _nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def layout(bucket: Iterable[tuple[str, Tensor]]) -> tuple[list[Entry], int]:
    """Where each tensor of `bucket` goes in a flat buffer, and the buffer's size."""
    entries, size = [], 0
    for name, tensor in bucket:
        entries.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), size))
        size += padded(_nbytes(tensor))
    return entries, size


def with_aliases(entries: list[Entry], aliases: dict[str, str]) -> list[Entry]:
    """`entries` plus, for each name -> alias of `aliases` whose name is there and alias is not, the alias over the
    same bytes (a tied LM head the sender names once)."""
    names = {entry[0] for entry in entries}
    extra = [(aliases[entry[0]], *entry[1:]) for entry in entries
             if entry[0] in aliases and aliases[entry[0]] not in names]
    return [*entries, *extra]


def fill(flat: Tensor, bucket: Iterable[tuple[str, Tensor]], entries: list[Entry]) -> None:
    """Copies the bucket's tensors into `flat` (uint8) at their entries' offsets."""
    for (_, tensor), (_, _, _, offset) in zip(bucket, entries, strict=False):
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        flat[offset:offset + raw.numel()].copy_(raw)


def unpack(flat: Tensor, entries: list[Entry]) -> list[tuple[str, Tensor]]:
    """(name, tensor) per entry, each a view into `flat`."""
    bucket = []
    for name, dtype, shape, offset in entries:
        dtype = getattr(torch, dtype)
        size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        bucket.append((name, flat[offset:offset + size].view(dtype).reshape(shape)))
    return bucket


def device_key(device: torch.device | str, slot: int | None = None) -> str:
    """Names the memory a handle can be opened from: a GPU by its UUID (the same in every process, whatever
    CUDA_VISIBLE_DEVICES numbers it), host memory by the machine's boot id, and with `EMULATE_ENV` set, the host's
    device `slot` (a placement slot: see the module's note)."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{torch.cuda.get_device_properties(index).uuid}"
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            key = f"host:{f.read().strip()}"
    except OSError:
        import socket

        key = f"host:{socket.gethostname()}"
    if slot is not None and os.environ.get(EMULATE_ENV) == "1":
        key += f"/device{slot}"
    return key


def engine_worker_slot(worker_rank: int) -> int | None:
    """The placement slot of this engine's worker `worker_rank` (its rank within the engine), or None outside a
    colocated engine."""
    first = os.environ.get(SLOT_ENV)
    return None if first is None else int(first) + worker_rank


class SharedBuffer:
    """A flat uint8 buffer of `size` bytes on `device` that other processes of the machine can map by `handle`;
    `close` when every receiver is done with it."""

    def __init__(self, size: int, device: torch.device | str):
        device = torch.device(device)
        self.path = None
        if device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            self.tensor = torch.empty(size, dtype=torch.uint8, device=device)
            self.handle: tuple = ("cuda", pickle.dumps(reduce_tensor(self.tensor)))
        else:
            handle, self.path = tempfile.mkstemp(prefix="rl-weights-", dir=_shm_dir())
            try:
                os.ftruncate(handle, max(size, 1))
            finally:
                os.close(handle)
            self.tensor = torch.from_file(self.path, shared=True, size=size, dtype=torch.uint8)
            self.handle = ("file", self.path, size)

    def fill(self, bucket: list[tuple[str, Tensor]], entries: list[Entry]) -> None:
        fill(self.tensor, bucket, entries)
        if self.tensor.is_cuda:
            torch.cuda.current_stream(self.tensor.device).synchronize()  # receivers read on streams of their own

    def close(self) -> None:
        self.tensor = None
        if self.path is not None:
            os.unlink(self.path)
            self.path = None


@contextlib.contextmanager
def shared(bucket: list[tuple[str, Tensor]], device: torch.device | str, key: str | None = None
           ) -> Iterator[tuple[dict[str, Any], list[Entry], int]]:
    """The bucket laid out in a `SharedBuffer` on `device`: yields (handles keyed by device: `key`, by default
    `device_key(device)`; entries; buffer bytes) for the receivers, and frees the buffer once the block ends (every
    receiver must be done with it by then). The buffer holds the bytes from the start of the block: the caller may
    drop the bucket's tensors there."""
    entries, size = layout(bucket)
    buffer = SharedBuffer(size, device)
    try:
        buffer.fill(bucket, entries)
        del bucket
        yield {key or device_key(device): buffer.handle}, entries, size
    finally:
        buffer.close()


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def open_shared(handle: tuple) -> Tensor:
    """The buffer behind a `SharedBuffer.handle`, mapped into this process (on its current GPU for a CUDA one)."""
    kind = handle[0]
    if kind == "cuda":
        rebuild, args = pickle.loads(handle[1])
        args = list(args)
        args[6] = torch.cuda.current_device()  # the storage's device, numbered as this process sees it
        return rebuild(*args)
    if kind == "file":
        _, path, size = handle
        return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    raise ValueError(f"unknown shared-weights handle kind {kind!r}")


def handle_for(handles: dict[str, Any], key: str) -> Any:
    """The handle on this process's device, or an error naming where the weights are and where this process is."""
    if key not in handles:
        raise RuntimeError(
            f"weights were shared on {sorted(handles)} and this engine worker is on {key}, where they cannot be "
            "opened: generator.weight_sync_backend=ipc needs every engine worker on a training worker's device; use "
            "generator.weight_sync_backend=ray (or null to choose it)")
    return handles[key]


def load_shared(handles: dict[str, Any], entries: list[Entry], key: str) -> list[tuple[str, Tensor]]:
    """The bucket shared for device `key`, as views into the mapped buffer."""
    return unpack(open_shared(handle_for(handles, key)), entries)
