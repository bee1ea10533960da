"""How the policy's new weights reach the generation engines after each step, chosen once per run by
`make_weight_sync` from where the engines live and `generator.weight_sync_backend`:

- `CollectiveSync` (gloo or nccl; the default for engines on devices of their own): rank 0 and the engine actors
  form a process group and rank 0 broadcasts each bucket (`TrainingBackend.weight_buckets`) to them.
- `SharedSync` (ipc; the default for engines sharing rank 0's device): rank 0 lays each bucket out in one buffer
  and hands the engines a handle to it (`rl.core.generation.shared_weights`: CUDA IPC on a GPU, /dev/shm on the
  host); each engine worker maps it on its own device and loads from it in place.
- `PushSync` (ray; the default for colocated engines not all on rank 0's device): rank 0 hands each bucket to
  every engine actor through Ray's object store.
- `DriverSync`: the colocated HF engine in the driver. Rank 0's full state comes to the driver, which copies it in.

The driver sees only counts in the first three. `sync(version)` names the policy version the weights are (the number
of optimizer updates behind them); it returns `sync_bytes` and `sync_buckets` for the step's metrics (the loop times
it as `sync_time_s`).
"""

from __future__ import annotations

from rl.backends.weight_sync import bucket_bytes
from rl.trainer.engines import RemoteEngines
from rl.trainer.worker_group import WorkerGroup


class PushSync:
    method = "push_weights"  # the workers' method that sends the buckets

    def __init__(self, group: WorkerGroup, engines: RemoteEngines, bucket_mb: int):
        self.group, self.engines, self.bucket_bytes = group, engines, bucket_mb << 20

    def sync(self, version: int) -> dict[str, float]:
        """Waits for the engines' submitted calls, then pushes; their later rollouts carry `version`."""
        self.engines.begin_update()
        sent = self.group.call(self.method, self.engines.actors, self.bucket_bytes)[0]
        self.engines.finish_update(version)
        return sent


class SharedSync(PushSync):
    """Engines on rank 0's device (host memory on CPU): buckets shared by handle; Ray carries handles and layouts."""

    method = "share_weights"


class CollectiveSync:
    """Engines on devices of their own: rank 0 and the engine actors form a process group (gloo or nccl) and rank 0
    broadcasts the buckets (`rl.backends.weight_stream`); Ray carries only the calls."""

    def __init__(self, group: WorkerGroup, engines: RemoteEngines, bucket_mb: int, backend: str):
        import ray

        self.group, self.engines, self.bucket_bytes = group, engines, bucket_mb << 20
        host, port = ray.get(group.actors[0].address.remote())
        world = 1 + len(engines.actors)
        ray.get([group.actors[0].join_weight_group.remote(host, port, world, backend)]
                + [a.join_weight_group.remote(host, port, i + 1, world, backend)
                   for i, a in enumerate(engines.actors)])

    def sync(self, version: int) -> dict[str, float]:
        from rl.trainer.waiting import wait_all

        self.engines.begin_update()
        receiving = [a.receive_weights.remote() for a in self.engines.actors]
        streaming = self.group.submit("stream_weights", self.bucket_bytes)
        # one wait for both sides: a member that stops answering holds up the others, and all of them are named
        sent = wait_all(streaming + receiving, self.group.labels + self.engines.labels, self.group.timeout_s)[0]
        self.engines.finish_update(version)
        return sent


class DriverSync:
    def __init__(self, group: WorkerGroup, engine):
        self.group, self.engine = group, engine

    def sync(self, version: int) -> dict[str, float]:
        state = list(self.group.call("full_state_dict")[0].items())
        self.engine.update_weights(state)
        return {"sync_bytes": float(bucket_bytes(state)), "sync_buckets": 1.0}


def transport(cfg, gpu: bool, shares_device: bool) -> str:
    """`generator.weight_sync_backend`, or its default for the placement: a collective for engines on devices of
    their own, handles for engines on rank 0's device, else Ray's object store."""
    chosen = cfg.generator.weight_sync_backend
    if chosen is not None:
        return chosen
    if not cfg.trainer.placement.colocate_all:
        return "nccl" if gpu else "gloo"
    return "ipc" if shares_device else "ray"


def engines_share_device(group: WorkerGroup, engines: RemoteEngines) -> bool:
    """Whether every process holding an engine's weights sits on training rank 0's device (so it can open a
    buffer rank 0 shares)."""
    import ray

    rank0 = ray.get(group.actors[0].device_key.remote())
    keys = engines.wait([a.device_keys.remote() for a in engines.actors])
    return all(key == rank0 for engine in keys for key in engine)


def make_weight_sync(cfg, group: WorkerGroup, engine):
    import torch

    if not isinstance(engine, RemoteEngines):
        return DriverSync(group, engine)
    gpu, bucket_mb = torch.cuda.is_available(), cfg.generator.weight_sync_bucket_mb
    chosen = cfg.generator.weight_sync_backend
    asks = chosen == "ipc" or (chosen is None and cfg.trainer.placement.colocate_all)  # ipc is chosen or may be
    shares = asks and engines_share_device(group, engine)
    kind = transport(cfg, gpu, shares)
    if kind == "ipc" and not shares:
        raise RuntimeError(
            "generator.weight_sync_backend=ipc: the engines' workers are not all on training rank 0's device "
            f"({engine.device}), and a shared buffer opens only there; set generator.weight_sync_backend=ray "
            "(or null to choose it)")
    print(f"weight sync: {kind}, buckets of {bucket_mb} MiB", flush=True)
    if kind == "ipc":
        return SharedSync(group, engine, bucket_mb)
    if kind == "ray":
        return PushSync(group, engine, bucket_mb)
    return CollectiveSync(group, engine, bucket_mb, kind)
