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


def group_placement(cfg: Config, role: str) -> tuple[int, int]:
    """(nodes, devices per node) of a group of its own for `role` ("ref" or "critic": `trainer.placement.
    <role>_num_nodes` / `<role>_num_gpus_per_node`); unset values follow the policy."""
    placement = cfg.trainer.placement
    nodes, gpus = getattr(placement, f"{role}_num_nodes"), getattr(placement, f"{role}_num_gpus_per_node")
    return (placement.policy_num_nodes if nodes is None else nodes,
            placement.policy_num_gpus_per_node if gpus is None else gpus)


def ref_world_size(cfg: Config) -> int:
    nodes, gpus = group_placement(cfg, "ref")
    return nodes * gpus


def critic_has_own_group(cfg: Config) -> bool:
    """Whether the critic trains on workers of its own: with `trainer.placement.colocate_all=false`, as SkyRL places
    it (`critic_num_nodes` x `critic_num_gpus_per_node`); otherwise on the policy's workers."""
    return cfg.trainer.algorithm.advantage_estimator == "gae" and not cfg.trainer.placement.colocate_all


def parallel_sizes(cfg: Config, role: str = "policy") -> ParallelSizes | None:
    """The sizes of the policy's workers, or with `role="critic"` of the critic's (its own group or the policy's);
    None when the model-parallel size does not divide the world (validation reports that)."""
    strategy = strategies.selected(cfg)
    if strategy is None:
        return None
    own = role == "critic" and critic_has_own_group(cfg)
    nodes, gpus = group_placement(cfg, "critic") if own else (1, policy_world_size(cfg))
    world = nodes * gpus
    group, how = strategy.model_parallel_size(cfg, role)
    if world < 1 or group < 1 or world % group:
        return None
    return ParallelSizes(world=world, data_parallel=world // group, how=f"world {world} / {how}")
