"""Which training rank feeds which engine worker its weights by handle (`generator.weight_sync_backend=ipc`).

A handle opens only on the device it was made on (`shared_weights.device_key`), so every engine worker is fed by a
training rank on its own device, the lowest such rank. On GPUs that is the rank whose GPU the placement gave the
worker (engine i's TP worker k beside rank i * TP + k, `placement.engine_slots`); on one CPU host every process
shares host memory and rank 0 feeds every worker, unless devices are emulated (`shared_weights.EMULATE_ENV`), where
each slot is a device and the plan is the GPU one. The driver decides it from the device keys the workers and the
engines report; the workers carry it out (`TrainingWorker.share_weights`), each sharing its own copy of a bucket on
its own device, and the rank feeding an engine's first worker hands the engine every handle it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FeedPlan:
    feeders: tuple[tuple[int, ...], ...]  # feeders[i][k]: the training rank that feeds engine i's worker k

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks that share buckets, in order."""
        return tuple(sorted({rank for engine in self.feeders for rank in engine}))

    def leads(self, rank: int) -> list[int]:
        """The engines whose calls `rank` makes: those whose first worker it feeds."""
        return [index for index, ranks in enumerate(self.feeders) if ranks[0] == rank]

    def describe(self) -> str:
        """One line: each feeding rank and the engine workers it feeds."""
        parts = []
        for rank in self.ranks:
            fed = [f"engine {index} worker {worker}" for index, ranks in enumerate(self.feeders)
                   for worker, feeder in enumerate(ranks) if feeder == rank]
            parts.append(f"rank {rank} -> {', '.join(fed)}")
        return "; ".join(parts)


def plan_feeds(rank_keys: Sequence[str], engine_keys: Sequence[Sequence[str]]) -> FeedPlan | None:
    """The plan for training ranks on devices `rank_keys` (rank order) and engines whose workers sit on
    `engine_keys[i]` (worker-rank order); None when some engine worker shares a device with no rank."""
    first: dict[str, int] = {}
    for rank, key in enumerate(rank_keys):
        first.setdefault(key, rank)
    if any(key not in first for keys in engine_keys for key in keys):
        return None
    return FeedPlan(tuple(tuple(first[key] for key in keys) for keys in engine_keys))


def unfed(rank_keys: Sequence[str], engine_keys: Sequence[Sequence[str]]) -> list[str]:
    """The engine workers no rank shares a device with, for messages."""
    known = set(rank_keys)
    return [f"engine {index} worker {worker} ({key})" for index, keys in enumerate(engine_keys)
            for worker, key in enumerate(keys) if key not in known]
