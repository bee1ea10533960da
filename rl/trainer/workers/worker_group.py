"""Training workers as Ray actors forming one torch.distributed group (gloo on CPU, nccl on GPU).

The launcher starts a local Ray instance with its files in the run directory unless an address is given, and always
shuts Ray down: on success, on error and on Ctrl-C. Where each worker sits is `rl.trainer.workers.placement`'s decision.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rl.backends.base import DataParallelRank
from rl.trainer.workers.waiting import wait_all

# Unix socket paths must stay under 108 bytes, and Ray appends up to ~64 characters to its temp dir
# (`/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store`); longer run dirs get a linked short temp dir while
# Ray runs, moved into the run directory when it stops.
_MAX_RAY_DIR = 40
_linked: tuple[str, str] | None = None  # (the run directory's link, the short temp dir it points to)


def _ray_temp_dir(run_dir: str) -> str:
    global _linked
    wanted = os.path.join(os.path.abspath(run_dir), "ray")
    if len(wanted) <= _MAX_RAY_DIR:
        os.makedirs(wanted, exist_ok=True)
        return wanted
    short = tempfile.mkdtemp(prefix="rl-ray-")
    if not os.path.lexists(wanted):
        os.symlink(short, wanted)
        _linked = (wanted, short)
    return short


def _keep_ray_files() -> None:
    """The short temp dir's files (Ray's logs: what each actor printed) into the run directory in place of its
    link, and the temp dir gone; sockets and pipes, dead with Ray, are left out."""
    global _linked
    if _linked is None:
        return
    link, short = _linked
    _linked = None
    if not (os.path.islink(link) and os.readlink(link) == short):
        return
    os.unlink(link)
    try:
        os.rename(short, link)
    except OSError:  # another filesystem
        def special(folder: str, names: list[str]) -> list[str]:
            return [n for n in names if not (os.path.isdir(os.path.join(folder, n)) or
                                             os.path.isfile(os.path.join(folder, n)))]
        shutil.copytree(short, link, symlinks=True, ignore=special, ignore_dangling_symlinks=True)
        shutil.rmtree(short, ignore_errors=True)


def start_ray(run_dir: str, address: str | None, slots: int = 0) -> None:
    """A local Ray instance (files in the run directory) with at least `slots` logical CPUs: on a machine without
    GPUs a placement bundle's device is one of them. With `address`, joins that cluster instead."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    from rl.trainer.workers import ray_lifeline

    ray_lifeline.start()  # the cluster's processes end with this one, however it ends
    # no idle workers started ahead: every actor of a run has a runtime_env of its own and cannot use them, and on a
    # small machine they take the cores the run's actors start on
    ray.init(_temp_dir=_ray_temp_dir(run_dir), include_dashboard=False, num_cpus=max(os.cpu_count() or 1, 2, slots),
             log_to_driver=True, configure_logging=False,
             _system_config={"prestart_worker_first_driver": False, "enable_worker_prestart": False})


def stop_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _keep_ray_files()


@dataclass(frozen=True)
class DataParallelLayout:
    """The group's data-parallel layout as the backends report it: which shard each rank runs, and which rank of
    each shard returns its results."""

    size: int
    shard_of_rank: tuple[int, ...]
    reporters: tuple[int, ...]  # reporters[d]: the rank that returns shard d's results

    @classmethod
    def of(cls, ranks: Sequence[DataParallelRank]) -> DataParallelLayout:
        sizes = {r.size for r in ranks}
        if len(sizes) != 1:
            raise RuntimeError(f"workers disagree on the data-parallel size: {sorted(sizes)}")
        size = sizes.pop()
        reporters = [[rank for rank, r in enumerate(ranks) if r.index == shard and r.reports] for shard in range(size)]
        if any(len(found) != 1 for found in reporters):
            raise RuntimeError(f"each data-parallel shard needs exactly one reporting rank, got {reporters}")
        return cls(size, tuple(r.index for r in ranks), tuple(found[0] for found in reporters))


class WorkerGroup:
    """`num_workers` TrainingWorker actors; `call` runs one method on all of them and returns rank-ordered results."""

    def __init__(self, num_workers: int, seed: int, options: Callable[[int], dict[str, Any]]):
        """`options(rank)`: the Ray actor options that place rank `rank` (`rl.trainer.workers.placement`)."""
        import ray

        from rl.backends.worker import TrainingWorker

        actor = ray.remote(TrainingWorker)
        self.actors = [actor.options(**options(rank)).remote(rank, num_workers, seed) for rank in range(num_workers)]
        self.size = num_workers
        self._places = [a.where.remote() for a in self.actors]  # started, not waited for: see `places`
        self.timeout_s: float | None = None  # trainer.actor_call_timeout_s
        self.collective_timeout_s: float | None = None  # trainer.collective_timeout_s
        self.role = "training worker"
        # A call reaches every rank in the same order as every other call (their collectives pair up) even when two
        # threads call: an engine replaced during a multi-turn episode gets its weights while the driver trains.
        self.order = threading.Lock()

    @property
    def places(self) -> list[str]:
        """Where each actor runs; the first use waits for the actors to be up."""
        import ray

        if self._places and not isinstance(self._places[0], str):
            self._places = ray.get(self._places)
        return self._places

    @property
    def labels(self) -> list[str]:
        """What each actor is, for messages about it."""
        return [f"{self.role} rank {rank} ({place})" for rank, place in enumerate(self.places)]

    def named_actors(self) -> list[tuple[Any, str]]:
        return list(zip(self.actors, self.labels, strict=True))

    def setup(self, backend: str, policy_spec, ref_spec, critic_spec=None) -> None:
        """Every worker joins the process group and builds `backend` (`package.module:Class`) for each model."""
        import ray

        host, port = ray.get(self.actors[0].host_rendezvous.remote(len(self.actors)))
        self.call("setup", host, port, backend, policy_spec, ref_spec, critic_spec, self.collective_timeout_s)
        if policy_spec is None:
            self.role = "reference worker" if ref_spec is not None else "critic worker"
        self.layout = DataParallelLayout.of(self.call("data_parallel_rank"))

    @property
    def dp_size(self) -> int:
        return self.layout.size

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return wait_all(self.submit(method, *args, **kwargs), self.labels, self.timeout_s)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`call` started without waiting: every rank's pending result."""
        with self.order:
            return [getattr(a, method).remote(*args, **kwargs) for a in self.actors]

    def call_sharded(self, method: str, shards: Sequence[Any], *args: Any) -> list[Any]:
        """Runs `method(shards[d], *args)` on every rank of data-parallel shard d; each shard goes into Ray's object
        store once and is read by the ranks of its model-parallel group. Returns the reporting rank's result of
        each shard, in shard order."""
        return self.collect_sharded(self.submit_sharded(method, shards, *args))

    def submit_sharded(self, method: str, shards: Sequence[Any], *args: Any) -> list[Any]:
        """`call_sharded` started without waiting: the pending result of every rank."""
        import ray

        if len(shards) != self.dp_size:
            raise ValueError(f"{method}: got {len(shards)} shards for a data-parallel size of {self.dp_size}")
        refs = [ray.put(shard) for shard in shards]
        with self.order:
            return [getattr(actor, method).remote(refs[shard], *args)
                    for actor, shard in zip(self.actors, self.layout.shard_of_rank, strict=True)]

    def collect_sharded(self, pending: list[Any]) -> list[Any]:
        results = wait_all(pending, self.labels, self.timeout_s)
        return [results[rank] for rank in self.layout.reporters]
