"""Where every actor of a run sits, decided once from the config and the cluster.

- The policy's workers: on CPU one Ray placement group with a bundle per node (`policy_num_gpus_per_node` slots
  each; STRICT_SPREAD over `policy_num_nodes` nodes, so each node's ranks share a host), rank r in bundle
  r // policy_num_gpus_per_node. On GPUs one bundle per GPU (vLLM's Ray executor takes bundles of at most one GPU
  for an engine's tensor-parallel workers), on one node (STRICT_PACK) or packed over several; the bundles are put in
  rank order grouped by node (`bundle_order`) and rank r takes the r-th. The reference model and a critic run on
  the same workers, unless `colocate_all=false` gives them groups of their own (the reference with
  `colocate_policy_ref=false`, the critic always, as SkyRL places it), laid out the same way.
- The generation engines: with `colocate_all=true` they share the workers' devices (the HF engine in the driver,
  vLLM engines sleeping while the workers train); with `colocate_all=false` they get a placement group of their own,
  one bundle of `inference_engine_tensor_parallel_size` devices per engine.
- Device slots: slot s is training rank s's device. Colocated engine i's TP worker k takes slot i * TP + k
  (`engine_slots`), so no two engine workers share a device, and each shares one with a training rank (which feeds
  it its weights, `rl.trainer.rollout.engine_feeds`). On GPUs an engine of TP 1 holds a share of its slot's GPU; an
  engine of
  TP > 1 holds nothing itself and hands vLLM its slots' bundle indices (`VLLM_RAY_BUNDLE_INDICES`), where vLLM's Ray
  executor starts one worker per bundle with a share of that GPU. Every colocated engine actor is told its first
  slot (`shared_weights.SLOT_ENV`), which a CPU run that emulates devices uses as its device's identity.
- Actors beside the workers on GPUs (colocated engines, reward models) sit in the workers' placement group, which
  holds every GPU it reserved: a worker asks `WORKER_GPU_SHARE` of a GPU, an engine worker `ENGINE_GPU_SHARE` and a
  reward model `GUEST_GPU_SHARE`. Ray never fills a GPU past 1, so two workers or two engine workers never share one,
  while an engine worker and a few reward models fit beside each worker.

On a machine without GPUs a device is a logical CPU slot of Ray, and with engines of their own the planner also
splits the machine's cores: one for each engine, the rest shared by the workers (`rl.backends.cores` pins each actor).
`fit_problems` tells, before anything starts, whether a layout fits the resources at hand.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rl.backends.cores import ENV as CORES_ENV
from rl.backends.cores import encode
from rl.core.generation.shared_weights import SLOT_ENV

ENGINE_GPU_SHARE = 0.01
GUEST_GPU_SHARE = 0.001
WORKER_GPU_SHARE = 1 - ENGINE_GPU_SHARE - 5 * GUEST_GPU_SHARE  # leaves room for one engine and five guests


@dataclass(frozen=True)
class Plan:
    nodes: int
    per_node: int  # policy devices per node
    engines: int  # engines on bundles of their own (0 when colocated)
    engine_devices: int
    gpu: bool
    colocated_engines: int = 0  # engine actors sharing the workers' devices (vLLM with colocate_all)
    ref_nodes: int = 0  # a reference group of its own (0: the reference runs on the policy's workers)
    ref_per_node: int = 0
    critic_nodes: int = 0  # a critic group of its own (0: the critic, if any, runs on the policy's workers)
    critic_per_node: int = 0
    worker_cores: tuple[int, ...] | None = None  # CPU machines with engines of their own (reference workers too)
    engine_cores: tuple[tuple[int, ...], ...] | None = None

    @property
    def workers(self) -> int:
        return self.nodes * self.per_node

    @property
    def ref_workers(self) -> int:
        return self.ref_nodes * self.ref_per_node

    @property
    def critic_workers(self) -> int:
        return self.critic_nodes * self.critic_per_node

    @property
    def training_workers(self) -> int:
        """Every training worker: the policy's and those of a reference or critic group of its own."""
        return self.workers + self.ref_workers + self.critic_workers

    @property
    def slots(self) -> int:
        """Devices the plan needs (logical CPU slots on a CPU machine)."""
        return self.training_workers + self.engines * self.engine_devices


def engine_slots(index: int, tensor_parallel: int) -> list[int]:
    """The device slots of colocated engine `index`'s workers, in TP-rank order: engine i's worker k on slot
    i * tensor_parallel + k, the device of training rank i * tensor_parallel + k. Distinct for every (engine, worker)
    while engines * tensor_parallel <= the workers (`check_engine_devices`)."""
    return list(range(index * tensor_parallel, (index + 1) * tensor_parallel))


def bundle_order(bundle_nodes: Sequence[str]) -> list[int]:
    """The workers' one-GPU bundles in slot order, given the node each bundle sits on: grouped by node (nodes in the
    order they first appear), so a node's ranks are consecutive; slot s is bundle `bundle_order(...)[s]`."""
    first: dict[str, int] = {}
    for node in bundle_nodes:
        first.setdefault(node, len(first))
    return sorted(range(len(bundle_nodes)), key=lambda bundle: (first[bundle_nodes[bundle]], bundle))


def needs_reference(cfg) -> bool:
    """Whether the run computes reference logprobs: for the KL loss or the KL penalty in the reward."""
    algorithm = cfg.trainer.algorithm
    return bool(algorithm.use_kl_loss or algorithm.use_kl_in_reward)


def make_plan(cfg, gpu: bool, cores: int) -> Plan:
    from rl.core.config.parallel import critic_has_own_group, group_placement

    placement, gen = cfg.trainer.placement, cfg.generator
    separate = not placement.colocate_all
    engines = gen.num_inference_engines if separate else 0
    own_ref = separate and not placement.colocate_policy_ref and needs_reference(cfg)
    ref_nodes, ref_per_node = group_placement(cfg, "ref") if own_ref else (0, 0)
    critic_nodes, critic_per_node = group_placement(cfg, "critic") if critic_has_own_group(cfg) else (0, 0)
    colocated_engines = gen.num_inference_engines if not separate and gen.backend != "hf" else 0
    plan = Plan(nodes=placement.policy_num_nodes, per_node=placement.policy_num_gpus_per_node, engines=engines,
                engine_devices=gen.inference_engine_tensor_parallel_size, gpu=gpu, ref_nodes=ref_nodes,
                ref_per_node=ref_per_node, critic_nodes=critic_nodes, critic_per_node=critic_per_node,
                colocated_engines=colocated_engines)
    if gpu or not separate or cores <= engines:
        return plan
    engine_cores = tuple((core,) for core in range(engines))
    return Plan(**{**plan.__dict__, "worker_cores": tuple(range(engines, cores)), "engine_cores": engine_cores})


def fit_problems(cfg, gpus: int, cores: int, remote: bool) -> list[str]:
    """Why the layout does not fit this machine (`gpus` devices, `cores` CPU cores); a remote cluster's resources
    are checked when its placement groups are created."""
    plan = make_plan(cfg, gpus > 0, cores)
    if remote:
        return []
    if cfg.generator.weight_sync_backend == "nccl" and not gpus:
        return ["generator.weight_sync_backend: nccl needs GPUs and this machine has none; use gloo (or null)"]
    if cfg.generator.weight_sync_backend == "ipc" and gpus and plan.engines:
        return ["generator.weight_sync_backend: ipc shares buffers on the training workers' GPUs, and these engines "
                "have GPUs of their own (trainer.placement.colocate_all=false); use nccl (or null)"]
    for key, nodes in (("policy", plan.nodes), ("ref", plan.ref_nodes), ("critic", plan.critic_nodes)):
        if nodes > 1:
            return [f"trainer.placement.{key}_num_nodes: {nodes} nodes need a Ray cluster of that many nodes, and "
                    "this run would start a one-node Ray of its own; start the cluster (examples/multinode) and pass "
                    "--ray_address, or set it to 1"]
    if plan.gpu:
        if plan.slots > gpus and plan.nodes == 1:
            return [f"trainer.placement.policy_num_gpus_per_node: {plan.training_workers} training workers and "
                    f"{plan.engines} engines x {plan.engine_devices} devices need {plan.slots} GPUs, this machine has "
                    f"{gpus}; lower them or set trainer.placement.colocate_all=true"]
        return []
    if plan.engines and plan.engines >= cores:
        return [f"generator.num_inference_engines: {plan.engines} engines on cores of their own "
                f"(trainer.placement.colocate_all=false) leave none of this machine's {cores} cores to the training "
                "workers; lower it or set trainer.placement.colocate_all=true"]
    return []


class Placement:
    """The placement groups of a plan, and the Ray options that put each actor in its bundle."""

    def __init__(self, plan: Plan, env: dict[str, str]):
        import ray
        from ray.util.placement_group import placement_group

        self.plan, self.env = plan, env
        self.workers = self._worker_group(plan.nodes, plan.per_node)
        groups = [self.workers]
        self.ref_workers = self.critic_workers = None
        if plan.ref_workers:
            self.ref_workers = self._worker_group(plan.ref_nodes, plan.ref_per_node)
            groups.append(self.ref_workers)
        if plan.critic_workers:
            self.critic_workers = self._worker_group(plan.critic_nodes, plan.critic_per_node)
            groups.append(self.critic_workers)
        self.engines = None
        if plan.engines:
            engine_bundle = {"GPU": plan.engine_devices, "CPU": 1} if plan.gpu else {"CPU": plan.engine_devices}
            self.engines = placement_group([dict(engine_bundle) for _ in range(plan.engines)], strategy="PACK")
            groups.append(self.engines)
        self.groups = groups
        for group in groups:
            if not group.wait(timeout_seconds=120):
                raise RuntimeError(f"the cluster cannot hold placement bundles {group.bundle_specs} "
                                   f"({ray.available_resources()} available); lower trainer.placement.* or "
                                   "generator.num_inference_engines, or add nodes")
        # slot s -> bundle: on GPUs a bundle per device, in rank order by node; on CPU a bundle per node
        self.worker_bundles = self._slot_bundles(self.workers, plan.workers, plan.per_node)
        self.ref_bundles = (self._slot_bundles(self.ref_workers, plan.ref_workers, plan.ref_per_node)
                            if self.ref_workers is not None else [])
        self.critic_bundles = (self._slot_bundles(self.critic_workers, plan.critic_workers, plan.critic_per_node)
                               if self.critic_workers is not None else [])

    def release(self) -> None:
        """Gives the cluster its bundles back (the run's actors must be gone first)."""
        from ray.util.placement_group import remove_placement_group

        for group in self.groups:
            remove_placement_group(group)

    def _worker_group(self, nodes: int, per_node: int):
        from ray.util.placement_group import placement_group

        if not self.plan.gpu:
            bundles = [{"CPU": per_node} for _ in range(nodes)]
            return placement_group(bundles, strategy="STRICT_SPREAD" if nodes > 1 else "PACK")
        bundles = [{"GPU": 1, "CPU": 1} for _ in range(nodes * per_node)]
        return placement_group(bundles, strategy="PACK" if nodes > 1 else "STRICT_PACK")

    def _slot_bundles(self, group, slots: int, per_node: int) -> list[int]:
        if not self.plan.gpu:
            return [slot // per_node for slot in range(slots)]
        from ray.util.placement_group import placement_group_table

        nodes = placement_group_table(group)["bundles_to_node_id"]
        return bundle_order([nodes[bundle] for bundle in range(slots)])

    def worker_options(self, rank: int) -> dict[str, Any]:
        share = WORKER_GPU_SHARE if self.plan.gpu else 1
        return self._options(self.workers, self.worker_bundles[rank], share, self._worker_env())

    def engine_bundles(self, index: int) -> list[int]:
        """The workers' bundles that colocated engine `index`'s TP workers take, in TP-rank order (on CPU, the
        bundle of each slot's worker)."""
        return [self.worker_bundles[slot] for slot in engine_slots(index, self.plan.engine_devices)]

    def colocated_engine_options(self, index: int) -> dict[str, Any]:
        """Engine `index` sharing the workers' devices (`engine_slots`). On GPUs with TP 1 the actor holds a share
        of its slot's GPU; with TP > 1 it holds nothing and vLLM's Ray executor starts one worker per slot's bundle
        with that share (the bundle indices handed to vLLM). On CPU no resources of its own (it runs between the
        workers' phases)."""
        first = engine_slots(index, self.plan.engine_devices)[0]
        env = {**self.env, SLOT_ENV: str(first)}
        if not self.plan.gpu:
            return {"num_cpus": 0, "num_gpus": 0, "runtime_env": {"env_vars": env}}
        bundles = self.engine_bundles(index)
        if len(bundles) == 1:
            return self._options(self.workers, bundles[0], ENGINE_GPU_SHARE, env)
        env.update(VLLM_RAY_BUNDLE_INDICES=",".join(map(str, bundles)), VLLM_RAY_PER_WORKER_GPUS=str(ENGINE_GPU_SHARE),
                   VLLM_ENABLE_V1_MULTIPROCESSING="0")  # the engine core in the actor, in the workers' group
        return self._options(self.workers, bundles[0], 0, env)

    def guest_options(self) -> dict[str, Any]:
        """A reward-model actor: on GPUs a small share of rank 0's GPU; on CPU no resources of its own."""
        if not self.plan.gpu:
            return {"num_cpus": 0, "num_gpus": 0, "runtime_env": {"env_vars": dict(self.env)}}
        return self._options(self.workers, self.worker_bundles[0], GUEST_GPU_SHARE, dict(self.env))

    def ref_worker_options(self, rank: int) -> dict[str, Any]:
        return self._options(self.ref_workers, self.ref_bundles[rank], 1, self._worker_env())

    def critic_worker_options(self, rank: int) -> dict[str, Any]:
        return self._options(self.critic_workers, self.critic_bundles[rank], 1, self._worker_env())

    def _worker_env(self) -> dict[str, str]:
        env = dict(self.env)
        if self.plan.worker_cores:
            env[CORES_ENV] = encode(self.plan.worker_cores)
            sharing = self.plan.training_workers
            env["OMP_NUM_THREADS"] = str(max(1, len(self.plan.worker_cores) // sharing))
        return env

    def engine_options(self, index: int) -> dict[str, Any]:
        env = dict(self.env)
        if self.plan.engine_cores:
            env[CORES_ENV] = encode(self.plan.engine_cores[index])
            env["OMP_NUM_THREADS"] = str(len(self.plan.engine_cores[index]))
        return self._options(self.engines, index, self.plan.engine_devices, env)

    def _options(self, group, bundle: int, devices: float, env: dict[str, str]) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=bundle)
        resources = {"num_gpus": devices, "num_cpus": 0} if self.plan.gpu else {"num_gpus": 0, "num_cpus": devices}
        return {"scheduling_strategy": strategy, "runtime_env": {"env_vars": env}, **resources}

    def describe(self) -> str:
        plan = self.plan
        where = f"{plan.workers} training worker(s) on {plan.nodes} node(s) x {plan.per_node}"
        if plan.ref_workers:
            where += f"; the reference model on {plan.ref_workers} worker(s) of its own ({plan.ref_nodes} x " \
                     f"{plan.ref_per_node})"
        if plan.critic_workers:
            where += f"; the critic on {plan.critic_workers} worker(s) of its own ({plan.critic_nodes} x " \
                     f"{plan.critic_per_node})"
        if plan.engines:
            where += f"; {plan.engines} engine(s) on their own {plan.engine_devices} device(s) each"
        if plan.engine_cores:
            where += f" (CPU cores: engines {list(plan.engine_cores)}, workers {list(plan.worker_cores)})"
        if plan.colocated_engines:
            slots = [engine_slots(i, plan.engine_devices) for i in range(plan.colocated_engines)]
            where += f"; {plan.colocated_engines} engine(s) beside them, TP {plan.engine_devices}, on the devices of " \
                     f"ranks {slots}"
            if plan.gpu:
                where += f" (bundles {[self.engine_bundles(i) for i in range(plan.colocated_engines)]})"
        return where


def machine_cores() -> int:
    return len(os.sched_getaffinity(0))
