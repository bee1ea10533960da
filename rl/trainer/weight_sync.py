"""How the policy's new weights reach the generation engine after each step, chosen once per run by
`make_weight_sync` from where the engine lives:

- `PushSync`: engines in Ray actors (vllm). The training workers gather the weights bucket by bucket
  (`TrainingBackend.weight_buckets`) and rank 0 hands each bucket to every engine actor through Ray's object store;
  the driver sees only the counts.
- `DriverSync`: the HF engine in the driver. Rank 0's full state comes to the driver, which copies it in.

`sync(version)` names the policy version the weights are (the number of optimizer updates behind them). Each returns
`sync_bytes` and `sync_buckets` for the step's metrics (the loop times it as `sync_time_s`).
"""

from __future__ import annotations

from rl.backends.weight_sync import bucket_bytes
from rl.trainer.engines import RemoteEngines
from rl.trainer.worker_group import WorkerGroup


class PushSync:
    def __init__(self, group: WorkerGroup, engines: RemoteEngines, bucket_mb: int):
        self.group, self.engines, self.bucket_bytes = group, engines, bucket_mb << 20

    def sync(self, version: int) -> dict[str, float]:
        """Waits for the engines' submitted calls, then pushes; their later rollouts carry `version`."""
        self.engines.begin_update()
        sent = self.group.call("push_weights", self.engines.actors, self.bucket_bytes)[0]
        self.engines.finish_update(version)
        return sent


class DriverSync:
    def __init__(self, group: WorkerGroup, engine):
        self.group, self.engine = group, engine

    def sync(self, version: int) -> dict[str, float]:
        state = list(self.group.call("full_state_dict")[0].items())
        self.engine.update_weights(state)
        return {"sync_bytes": float(bucket_bytes(state)), "sync_buckets": 1.0}


def make_weight_sync(cfg, group: WorkerGroup, engine):
    if isinstance(engine, RemoteEngines):
        return PushSync(group, engine, cfg.generator.weight_sync_bucket_mb)
    return DriverSync(group, engine)
