"""Where colocated vLLM engines sit on a GPU machine, against a real Ray told it has GPUs (Ray schedules by resource
counts, so the layout it decides is the one a GPU node gets; nothing here touches a GPU).

The workers' placement group reserves every GPU it holds, so an engine actor asking a share of a GPU outside it is
never scheduled (shown first, the control). Placed as `Placement.colocated_engine_options` says, every engine starts
on a GPU of its own among the training workers', each worker keeps a GPU of its own, and reward-model actors
(`guest_options`) start beside them."""

import os

import pytest

import rl.backends.registry  # noqa: F401  (registers the strategies the config names)
from rl.core.config.loader import load_config
from rl.trainer.placement import ENGINE_GPU_SHARE, Placement, fit_problems, make_plan

GPUS = 4


@pytest.fixture(scope="module")
def ray_with_gpus():
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    # "local": a new instance even while another process's cluster (a test's shared one) is the machine's latest
    ray.init(address="local", num_cpus=GPUS, num_gpus=GPUS, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def _probe_class():
    """An actor class that reports its GPUs (defined in a function, so Ray ships it by value)."""

    class Probe:
        def gpu_ids(self) -> list[str]:
            import ray

            return [str(i) for i in ray.get_gpu_ids()]

    return Probe


def _started(ray, actors, timeout: float) -> list | None:
    refs = [actor.gpu_ids.remote() for actor in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    return ray.get(refs) if len(ready) == len(refs) else None


def test_colocated_engines_and_reward_models_start_beside_the_workers(ray_with_gpus):
    ray = ray_with_gpus
    cfg = load_config(["generator.backend=vllm", f"trainer.placement.policy_num_gpus_per_node={GPUS}",
                       "generator.num_inference_engines=2"])
    placement = Placement(make_plan(cfg, gpu=True, cores=GPUS), {})
    probe = ray.remote(_probe_class())
    workers = [probe.options(**placement.worker_options(rank)).remote() for rank in range(GPUS)]
    worker_gpus = _started(ray, workers, 60)
    assert worker_gpus is not None and sorted(g for ids in worker_gpus for g in ids) == [str(i) for i in range(GPUS)]

    outside = probe.options(num_gpus=ENGINE_GPU_SHARE, num_cpus=0).remote()  # the control: no GPU left outside
    assert _started(ray, [outside], 3) is None
    ray.kill(outside)

    engines = [probe.options(**placement.colocated_engine_options(i)).remote() for i in range(2)]
    engine_gpus = _started(ray, engines, 60)
    assert engine_gpus is not None, "colocated engines were never scheduled"
    assert all(len(ids) == 1 for ids in engine_gpus) and len({ids[0] for ids in engine_gpus}) == 2
    assert {ids[0] for ids in engine_gpus} <= {ids[0] for ids in worker_gpus}

    guests = [probe.options(**placement.guest_options()).remote() for _ in range(3)]  # reward models
    guest_gpus = _started(ray, guests, 60)
    assert guest_gpus is not None, "reward-model actors were never scheduled"
    assert all(len(ids) == 1 and ids[0] in {i[0] for i in worker_gpus} for ids in guest_gpus)


def test_colocated_engines_with_tensor_parallelism_are_refused_on_gpus():
    cfg = load_config(["generator.backend=vllm", "trainer.placement.policy_num_gpus_per_node=4",
                       "generator.inference_engine_tensor_parallel_size=2"])
    (problem,) = fit_problems(cfg, gpus=4, cores=16, remote=False)
    assert problem.startswith("generator.inference_engine_tensor_parallel_size: 2") and "colocate_all=false" in problem
    assert fit_problems(cfg, gpus=0, cores=16, remote=False) == []  # on CPU an engine is a process, TP works
