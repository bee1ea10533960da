"""World and data-parallel sizes implied by a config (used by validation and by the backends)."""

from __future__ import annotations

from dataclasses import dataclass

from rl.core.config import strategies
from rl.core.config.schema import Config


@dataclass(frozen=True)
class ParallelSizes:
    world: int
    """policy_num_nodes * policy_num_gpus_per_node."""
    data_parallel: int
    """Ranks that see different data: world / the strategy's model-parallel size (ranks that share a shard)."""
    how: str
    """How data_parallel was derived, for error messages."""


def policy_world_size(cfg: Config) -> int:
    placement = cfg.trainer.placement
    return placement.policy_num_nodes * placement.policy_num_gpus_per_node


def ref_placement(cfg: Config) -> tuple[int, int]:
    """(nodes, devices per node) of the reference model; unset values follow the policy."""
    placement = cfg.trainer.placement
    nodes = placement.policy_num_nodes if placement.ref_num_nodes is None else placement.ref_num_nodes
    gpus = placement.ref_num_gpus_per_node
    return nodes, placement.policy_num_gpus_per_node if gpus is None else gpus


def ref_world_size(cfg: Config) -> int:
    nodes, gpus = ref_placement(cfg)
    return nodes * gpus


def parallel_sizes(cfg: Config) -> ParallelSizes | None:
    """The sizes, or None when the model-parallel size does not divide the world (validation reports that)."""
    strategy = strategies.selected(cfg)
    if strategy is None:
        return None
    world = policy_world_size(cfg)
    group, how = strategy.model_parallel_size(cfg)
    if world < 1 or group < 1 or world % group:
        return None
    return ParallelSizes(world=world, data_parallel=world // group, how=f"world {world} / {how}")
