"""Generation engines in Ray actors (`generator.backend=vllm`): `generator.num_inference_engines` of them, the
prompts of a call split evenly between them, and the weights pushed to them by the training workers' rank 0 in
buckets (`rl.backends.weight_sync`), never through the driver."""

from __future__ import annotations

from typing import Any

import torch

from rl.backends.lifeline import exit_with_parent
from rl.core.generation import GenerationEngine, Rollout, SamplingParams, build_engine


class EngineActor:
    """One engine of `GENERATION_ENGINES`, built in the actor."""

    def __init__(self, name: str, model_path: str, kwargs: dict[str, Any]):
        exit_with_parent()
        self.engine = build_engine(name, model_path, model_path, **kwargs)

    def where(self) -> str:
        import socket

        return f"{socket.gethostname()} ({self.engine.device})"

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        return self.engine.generate(prompts, params)

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.engine.update_weights(named_tensors)

    def offload(self) -> None:
        self.engine.offload()

    def reload(self) -> None:
        self.engine.reload()


class RemoteEngines(GenerationEngine):
    """The driver's view of the engine actors: one `GenerationEngine` whose calls fan out to all of them."""

    def __init__(self, name: str, model_path: str, count: int, kwargs: dict[str, Any], env: dict[str, str]):
        import ray

        use_gpu = torch.cuda.is_available()
        tp = kwargs.get("tensor_parallel_size", 1)
        # colocated: an engine shares its devices with training workers (sleep mode frees them while they train)
        actor = ray.remote(EngineActor).options(num_cpus=0, num_gpus=0.01 * tp if use_gpu else 0,
                                                runtime_env={"env_vars": env})
        self.actors = [actor.remote(name, model_path, kwargs) for _ in range(count)]
        self.places = ray.get([a.where.remote() for a in self.actors])
        self.device = ", ".join(f"engine {i}: {place}" for i, place in enumerate(self.places))

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        """Prompts split into contiguous shares, one per engine; rollouts back in prompt-major order with the
        prompt indices of the whole call."""
        import ray

        share = -(-len(prompts) // len(self.actors))
        starts = list(range(0, len(prompts), share)) if prompts else []
        parts = ray.get([a.generate.remote(prompts[s:s + share], params) for a, s in zip(self.actors, starts,
                                                                                          strict=False)])
        rollouts = []
        for start, part in zip(starts, parts, strict=True):
            for rollout in part:
                rollout.prompt_index += start
                rollouts.append(rollout)
        return rollouts

    def update_weights(self, named_tensors) -> None:
        import ray

        bucket = list(named_tensors)
        ray.get([a.update_weights.remote(bucket) for a in self.actors])

    def offload(self) -> None:
        import ray

        ray.get([a.offload.remote() for a in self.actors])

    def reload(self) -> None:
        import ray

        ray.get([a.reload.remote() for a in self.actors])
