"""Where colocated vLLM engines sit on a GPU machine, against a real Ray told it has 4 GPUs (Ray schedules by
resource counts, so the layout it decides is the one a GPU node gets; nothing here touches a GPU). 4 GPUs take every
case an 8-GPU node does (several engines, one engine over all of them, TP 1, 2 and 4) with half the actors.

Placed as `Placement.colocated_engine_options` says, for engine TP 1, 2 and 4 with as many engines as the GPUs hold:
every training worker has a GPU of its own, and engine i's TP worker k starts on the GPU of training rank i * TP + k,
its placement slot. With TP > 1 the probe standing for the engine does what vLLM's Ray executor does with the bundle
indices it is handed (vllm/v1/executor/ray_utils.py and ray_executor.py): it checks that no bundle of its placement
group holds more than one GPU and that the indices are distinct, one per TP rank, then starts one worker per bundle
asking `VLLM_RAY_PER_WORKER_GPUS` of a GPU. With TP 1 also the controls: the workers' placement group reserves every
GPU, so an actor asking a share of a GPU outside it is never scheduled; a second engine worker on a GPU never starts
(one worker's and one engine worker's shares leave less than an engine worker's); reward-model actors
(`guest_options`) start beside rank 0."""

import contextlib
import os

import pytest

import rl.backends.registry  # noqa: F401  (registers the strategies the config names)
from rl.core.config.loader import load_config
from rl.core.generation.shared_weights import SLOT_ENV
from rl.trainer.workers.placement import (
    ENGINE_GPU_SHARE,
    Placement,
    bundle_order,
    engine_slots,
    fit_problems,
    make_plan,
)


@pytest.fixture(scope="module", params=[4], ids=lambda gpus: f"{gpus}gpus")
def ray_with_gpus(request):
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    # "local": a new instance even while another process's cluster (a test's shared one) is the machine's latest
    ray.init(address="local", num_cpus=request.param, num_gpus=request.param, include_dashboard=False,
             logging_level="ERROR")
    yield ray, request.param
    ray.shutdown()


def _probe_class():
    """An actor class that reports its GPUs, and those of the engine workers it stands for (defined in a function,
    so Ray ships it by value)."""

    class Probe:
        def gpu_ids(self) -> list[str]:
            import ray

            return [str(i) for i in ray.get_gpu_ids()]

        def slot(self) -> str | None:
            return os.environ.get(SLOT_ENV)

        def engine_worker_gpus(self) -> list[str]:
            """Each TP worker's GPU, in TP-rank order: the actor's own without bundle indices (vLLM runs TP 1 in the
            actor's process), else one worker per handed bundle as vLLM's Ray executor starts them."""
            import ray
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            indices = os.environ.get("VLLM_RAY_BUNDLE_INDICES")
            if not indices:
                return self.gpu_ids()
            group = ray.util.get_current_placement_group()
            assert group is not None, "the engine actor is in no placement group"
            assert all(bundle.get("GPU", 0) <= 1 for bundle in group.bundle_specs), "vLLM: a bundle holds > 1 GPU"
            bundles = [int(index) for index in indices.split(",")]
            assert len(set(bundles)) == len(bundles), "vLLM: duplicate bundle indices"

            class Worker:
                def gpu_ids(self) -> list[str]:
                    return [str(i) for i in ray.get_gpu_ids()]

            share = float(os.environ["VLLM_RAY_PER_WORKER_GPUS"])
            self.workers = [ray.remote(Worker).options(
                num_cpus=0, num_gpus=share, scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=bundle,
                    placement_group_capture_child_tasks=True)).remote() for bundle in bundles]
            refs = [worker.gpu_ids.remote() for worker in self.workers]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=60)
            assert len(ready) == len(refs), "an engine worker was never scheduled"
            return [ids[0] for ids in ray.get(refs)]

    return Probe


def _started(ray, refs: list, timeout: float) -> list | None:
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    return ray.get(refs) if len(ready) == len(refs) else None


@contextlib.contextmanager
def _placed(ray, gpus: int, tp: int, engines: int):
    """The placement of `engines` vLLM engines of TP `tp` beside `gpus` workers, removed afterwards with every actor
    started in it."""
    from ray.util.placement_group import remove_placement_group

    cfg = load_config(["generator.backend=vllm", f"trainer.placement.policy_num_gpus_per_node={gpus}",
                       f"generator.num_inference_engines={engines}",
                       f"generator.inference_engine_tensor_parallel_size={tp}"])
    assert fit_problems(cfg, gpus=gpus, cores=16, remote=False) == []
    placement = Placement(make_plan(cfg, gpu=True, cores=gpus), {})
    actors: list = []
    try:
        yield placement, actors
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(placement.workers)


def _start_workers(ray, placement, actors, gpus: int) -> list[str]:
    probe = ray.remote(_probe_class())
    workers = [probe.options(**placement.worker_options(rank)).remote() for rank in range(gpus)]
    actors += workers
    worker_gpus = _started(ray, [w.gpu_ids.remote() for w in workers], 60)
    assert worker_gpus is not None and all(len(ids) == 1 for ids in worker_gpus)
    assert sorted(int(ids[0]) for ids in worker_gpus) == list(range(gpus)), "one GPU per training worker"
    return [ids[0] for ids in worker_gpus]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_engine_workers_take_the_gpus_of_their_slots(ray_with_gpus, tp):
    ray, gpus = ray_with_gpus
    engines = gpus // tp
    probe = ray.remote(_probe_class())
    with _placed(ray, gpus, tp, engines) as (placement, actors):
        worker_gpus = _start_workers(ray, placement, actors, gpus)
        if tp == 1:  # the control: no GPU left outside the workers' group
            outside = probe.options(num_gpus=ENGINE_GPU_SHARE, num_cpus=0).remote()
            actors.append(outside)
            assert _started(ray, [outside.gpu_ids.remote()], 3) is None
        options = [placement.colocated_engine_options(i) for i in range(engines)]
        assert all(o["num_gpus"] == (ENGINE_GPU_SHARE if tp == 1 else 0) for o in options)
        probes = [probe.options(**o).remote() for o in options]
        actors += probes
        found = _started(ray, [p.engine_worker_gpus.remote() for p in probes], 120)
        assert found is not None, "an engine was never scheduled"
        want = [[worker_gpus[slot] for slot in engine_slots(i, tp)] for i in range(engines)]
        assert found == want, "engine i's TP worker k on training rank i * TP + k's GPU"
        assert len({gpu for engine in found for gpu in engine}) == gpus, "never two engine workers on a GPU"
        assert ray.get([p.slot.remote() for p in probes]) == [str(i * tp) for i in range(engines)]
        if tp == 1:
            # a second engine worker on rank 0's GPU: the worker's and the engine's shares leave less than one
            second = probe.options(**placement.colocated_engine_options(0)).remote()
            actors.append(second)
            assert _started(ray, [second.gpu_ids.remote()], 3) is None
            guests = [probe.options(**placement.guest_options()).remote() for _ in range(3)]  # reward models
            actors += guests
            assert _started(ray, [g.gpu_ids.remote() for g in guests], 60) == [[worker_gpus[0]]] * 3


def test_slots_and_bundle_order():
    assert [engine_slots(i, 2) for i in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert engine_slots(1, 4) == [4, 5, 6, 7]
    # bundles on two nodes, interleaved as Ray may place them: each node's bundles become consecutive ranks
    assert bundle_order(["n2", "n1", "n2", "n1"]) == [0, 2, 1, 3]
    assert bundle_order(["n1"] * 4) == [0, 1, 2, 3]


def test_a_critic_has_workers_of_its_own_only_with_colocate_all_false():
    """SkyRL's placement of the critic: on the policy's devices with colocate_all=true, on `critic_num_nodes` x
    `critic_num_gpus_per_node` devices of its own (null: the policy's) with colocate_all=false; the slots count them."""
    gae = ["trainer.algorithm.advantage_estimator=gae", "trainer.placement.policy_num_gpus_per_node=2"]
    colocated = make_plan(load_config(overrides=gae), gpu=True, cores=8)
    assert (colocated.critic_workers, colocated.slots) == (0, 2)
    apart = make_plan(load_config(overrides=[*gae, "trainer.placement.colocate_all=false"]), gpu=True, cores=8)
    assert (apart.critic_nodes, apart.critic_per_node, apart.slots) == (1, 2, 2 + 2 + 1)  # policy, critic, engine
    sized = make_plan(load_config(overrides=[*gae, "trainer.placement.colocate_all=false",
                                             "trainer.placement.critic_num_gpus_per_node=4"]), gpu=True, cores=8)
    assert (sized.critic_workers, sized.training_workers) == (4, 6)
    grpo = make_plan(load_config(overrides=["trainer.placement.colocate_all=false"]), gpu=True, cores=8)
    assert grpo.critic_workers == 0  # no critic without gae
    assert fit_problems(load_config(overrides=[*gae, "trainer.placement.colocate_all=false",
                                               "trainer.placement.critic_num_nodes=2"]), 0, 8, remote=False) == [
        "trainer.placement.critic_num_nodes: 2 nodes need a Ray cluster of that many nodes, and this run would start "
        "a one-node Ray of its own; start the cluster (examples/multinode) and pass --ray_address, or set it to 1"]
