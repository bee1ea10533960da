"""The process group a training worker belongs to: gloo on CPU, nccl on GPU."""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    device: torch.device
    timeout_s: float | None = None  # trainer.collective_timeout_s; None: torch's defaults

    @property
    def is_main(self) -> bool:
        return self.rank == 0


STORE_TIMEOUT = datetime.timedelta(minutes=30)  # how long a member waits for the others at the store


def host_store(world_size: int) -> tuple[dist.TCPStore, str, int]:
    """A rendezvous store this process hosts, with the address its members connect to. It listens on a port the OS
    picks and holds from then on: a port probed free and handed on can be taken by another process before rank 0
    listens on it."""
    host = socket.gethostbyname(socket.gethostname())
    store = dist.TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT)
    return store, host, store.port


def connect_store(host: str, port: int, world_size: int) -> dist.TCPStore:
    """A member's connection to a store another process hosts (`host_store`)."""
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=STORE_TIMEOUT)


def init_distributed(rank: int, world_size: int, master_addr: str, master_port: int,
                     timeout_s: float | None = None, store: dist.Store | None = None) -> DistInfo:
    """Joins (or creates) the default process group; one worker per device, one process per worker on CPU.
    `timeout_s` bounds every collective of this process's groups, the ones the libraries create later included.
    `store`: the group's rendezvous store where one is hosted already (`host_store`, `connect_store`); without it,
    rank 0 listens on `master_port` (0 for a group of one)."""
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
    if timeout is not None:
        # torch's new_group (FSDP's meshes, DeepSpeed's and Megatron-Core's groups, ours) takes these defaults
        c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
    if not dist.is_initialized():
        # Each worker sees one device (Ray sets CUDA_VISIBLE_DEVICES per actor): its local rank is 0 on GPU.
        local_rank = 0 if use_cuda else rank
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size, store=store,
                                device_id=device if use_cuda else None, timeout=timeout)
    return DistInfo(rank=rank, world_size=world_size, device=device, timeout_s=timeout_s)

