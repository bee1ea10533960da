"""How the policy's new weights reach the generation engines after each step, chosen once per run by
`make_weight_sync` from where the engines live and `generator.weight_sync_backend`:

- `CollectiveSync` (gloo or nccl; the default for engines on devices of their own): rank 0 and the engine actors
  form a process group and rank 0 broadcasts each bucket (`TrainingBackend.weight_buckets`) to them.
- `SharedSync` (ipc; the default for engines whose every worker shares a device with a training rank): each rank
  that shares a device with engine workers lays each bucket out in one buffer there and hands the engines a handle to
  it (`rl.core.generation.shared_weights`: CUDA IPC on a GPU, /dev/shm on the host); each engine worker maps the
  buffer of the rank on its device and loads from it in place. Which rank feeds which worker:
  `rl.trainer.rollout.engine_feeds`, printed at the start. Where ranks other than 0 feed, every rank gathers each bucket
  on its own device (`weight_sync.device_buckets`); a strategy that gathers on rank 0 only falls back to `PushSync`.
- `PushSync` (ray; the default for colocated engines no rank can feed by handle): rank 0 hands each bucket to
  every engine actor through Ray's object store.
- `DriverSync`: the colocated HF engine in the driver. Rank 0's full state comes to the driver, which copies it in.

The driver sees only counts in the first three. `sync(version)` names the policy version the weights are (the number
of optimizer updates behind them); it returns `sync_bytes` and `sync_buckets` for the step's metrics (the loop times
it as `sync_time_s`). `bring_up(actor)` gives an engine actor that replaced a lost one the weights the engines hold,
through Ray's object store whatever the transport (a weight group is formed again at the next sync): the ones rank 0
holds, or, where the policy may train ahead of the engines (rollouts queued ahead, `max_staleness_steps` > 0), a
host copy rank 0 keeps of the weights it last sent (`keeps_sent_weights`).
"""

from __future__ import annotations

from rl.backends.weight_sync import bucket_bytes
from rl.trainer.rollout.engine_feeds import FeedPlan, plan_feeds, unfed
from rl.trainer.rollout.engines import RemoteEngines
from rl.trainer.workers.worker_group import WorkerGroup


class PushSync:
    def __init__(self, group: WorkerGroup, engines: RemoteEngines, bucket_mb: int):
        self.group, self.engines, self.bucket_bytes = group, engines, bucket_mb << 20
        engines.bring_up = self.bring_up

    def bring_up(self, actor) -> None:
        self.group.call("push_sent_weights", [actor], self.bucket_bytes)

    def sync(self, version: int) -> dict[str, float]:
        """Waits for the engines' submitted calls, then sends; their later rollouts carry `version`."""
        self.engines.begin_update()
        sent = self.send()
        self.engines.finish_update(version)
        return sent

    def send(self) -> dict[str, float]:
        return self.group.call("push_weights", self.engines.actors, self.bucket_bytes)[0]


class SharedSync(PushSync):
    """Every engine worker on a training rank's device: buckets shared by handle by the ranks `feeds` names; Ray
    carries handles and layouts."""

    def __init__(self, group: WorkerGroup, engines: RemoteEngines, bucket_mb: int, feeds: FeedPlan):
        super().__init__(group, engines, bucket_mb)
        self.feeds = feeds

    def send(self) -> dict[str, float]:
        return self.group.call("share_weights", self.engines.actors, self.bucket_bytes, self.feeds.feeders)[0]


class CollectiveSync(PushSync):
    """Engines on devices of their own: rank 0 and the engine actors form a process group (gloo or nccl) and rank 0
    broadcasts the buckets (`rl.backends.weight_stream`); Ray carries only the calls."""

    def __init__(self, group: WorkerGroup, engines: RemoteEngines, bucket_mb: int, backend: str):
        super().__init__(group, engines, bucket_mb)
        self.backend = backend
        self.form()

    def form(self) -> None:
        """Rank 0 and the engines the run has now join a weight group (collective: all of them)."""
        import ray

        engines, world = self.engines, 1 + len(self.engines.actors)
        host, port = ray.get(self.group.actors[0].host_rendezvous.remote(world))
        ray.get([self.group.actors[0].join_weight_group.remote(host, port, world, self.backend)]
                + [a.join_weight_group.remote(host, port, i + 1, world, self.backend)
                   for i, a in enumerate(engines.actors)])
        self.formed = engines.fleet

    def sync(self, version: int) -> dict[str, float]:
        from rl.trainer.workers.waiting import wait_all

        self.engines.begin_update()
        if self.formed != self.engines.fleet:  # an engine was replaced since the group formed
            self.form()
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


def transport(cfg, gpu: bool, by_handle: bool) -> str:
    """`generator.weight_sync_backend`, or its default for the placement: a collective for engines on devices of
    their own, handles for colocated engines the training ranks can feed by handle, else Ray's object store."""
    chosen = cfg.generator.weight_sync_backend
    if chosen is not None:
        return chosen
    if not cfg.trainer.placement.colocate_all:
        return "nccl" if gpu else "gloo"
    return "ipc" if by_handle else "ray"


def find_feeds(group: WorkerGroup, engines: RemoteEngines) -> tuple[FeedPlan | None, str]:
    """Which rank feeds which engine worker by handle (`engine_feeds.plan_feeds` over the devices every rank and
    every engine worker reports), or None and why not."""
    rank_keys = group.call("device_key")
    engine_keys = engines.wait([a.device_keys.remote() for a in engines.actors])
    feeds = plan_feeds(rank_keys, engine_keys)
    if feeds is None:
        return None, (f"no training worker ({', '.join(rank_keys)}) shares a device with "
                      f"{', '.join(unfed(rank_keys, engine_keys))}, and a shared buffer opens only on its own device")
    if feeds.ranks != (0,) and not all(group.call("gathers_on_every_rank")):
        return None, (f"engine workers sit on the devices of ranks {list(feeds.ranks)}, and this strategy gathers "
                      "its weights on rank 0 only")
    return feeds, ""


def keeps_sent_weights(cfg) -> bool:
    """Whether an engine may be replaced while the policy has trained past the weights the engines hold: engines
    are replaced (`trainer.max_restarts`) and rollouts are generated ahead of training."""
    asynchronous = cfg.trainer.fully_async
    return cfg.trainer.max_restarts > 0 and asynchronous.enabled and asynchronous.max_staleness_steps > 0


def make_weight_sync(cfg, group: WorkerGroup, engine):
    import torch

    if not isinstance(engine, RemoteEngines):
        return DriverSync(group, engine)
    gpu, bucket_mb = torch.cuda.is_available(), cfg.generator.weight_sync_bucket_mb
    chosen = cfg.generator.weight_sync_backend
    asks = chosen == "ipc" or (chosen is None and cfg.trainer.placement.colocate_all)  # ipc is chosen or may be
    feeds, why = find_feeds(group, engine) if asks else (None, "")
    kind = transport(cfg, gpu, feeds is not None)
    if kind == "ipc" and feeds is None:
        raise RuntimeError(f"generator.weight_sync_backend=ipc: {why} ({engine.device}); set "
                           "generator.weight_sync_backend=ray (or null to choose it)")
    print(f"weight sync: {kind}, buckets of {bucket_mb} MiB", flush=True)
    if keeps_sent_weights(cfg):
        group.call("keep_sent_weights", bucket_mb << 20)
        print("weight sync: rank 0 keeps a host copy of the weights the engines hold, for an engine that replaces a "
              "lost one while training runs ahead of them (trainer.max_restarts with max_staleness_steps > 0)",
              flush=True)
    if kind == "ipc":
        print(f"weight feeds by handle: {feeds.describe()}", flush=True)
        return SharedSync(group, engine, bucket_mb, feeds)
    if kind == "ray":
        if why:
            print(f"weight feeds: rank 0 to every engine through Ray's object store ({why})", flush=True)
        return PushSync(group, engine, bucket_mb)
    return CollectiveSync(group, engine, bucket_mb, kind)
