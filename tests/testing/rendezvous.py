"""Where the process groups that tests spawn meet: a store the test's own process hosts on a port the OS picked and
holds (`rl.backends.dist.host_store`), so that a test running beside it cannot take the port first, as it can take
a port probed free and handed on."""

from collections.abc import Iterator
from contextlib import contextmanager

from rl.backends.dist import DistInfo, connect_store, host_store, init_distributed

HOST = "127.0.0.1"


@contextmanager
def rendezvous(world_size: int) -> Iterator[int]:
    """The port of a store hosted for `world_size` members while the block runs (the spawned group's lifetime)."""
    store, _, port = host_store(world_size)
    try:
        yield port
    finally:
        del store


def join(rank: int, world_size: int, port: int, timeout_s: float | None = None) -> DistInfo:
    """A spawned member's `init_distributed` through the test's store at `port`."""
    return init_distributed(rank, world_size, HOST, port, timeout_s, connect_store(HOST, port, world_size))
