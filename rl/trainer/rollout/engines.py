"""Generation engines in Ray actors (`generator.backend=vllm`, or any engine with
`trainer.placement.colocate_all=false`): `generator.num_inference_engines` of them, the prompts of a call split
evenly between them, and the weights sent to them by the training workers in buckets (`rl.trainer.rollout.weight_sync`:
by handle from the ranks on their devices, or from rank 0), never through the driver. Calls can be started and
collected later (`submit`/`collect`), which is how generation overlaps training (`rl.trainer.rollout.rollout_queue`).

With partial rollouts (`trainer.fully_async.partial_rollout_tokens` > 0) an engine actor generates in segments
(`rl.core.generation.segments`) on a thread of its own, and takes weight updates on another: an update waits for
the segment in progress, and the next segment waits for the update, so new weights land mid-call.

An engine that dies or stops answering during a generation call is replaced on its own (`trainer.max_restarts`
engine replacements): a new actor in the same placement bundle, brought to the policy version the others hold by a
push from training rank 0 (`bring_up`, set by the weight sync), and every call in flight on the lost engine issued
again to it with the same prompts and seeds. Rollouts depend only on the seed, the weights and the prompts, so the
step's rollouts are the ones the lost engine would have returned when the pushed weights are the version it held:
always in a synchronous run, where nothing trains while the engines generate."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rl.backends.cores import pin_to_assigned_cores
from rl.backends.lifeline import exit_with_parent
from rl.core.generation import GenerationEngine, Rollout, SamplingParams, build_engine
from rl.trainer.state.faults import crash_point, segment_delay
from rl.trainer.workers.restarts import ENGINE, RestartBudget
from rl.trainer.workers.waiting import ActorHung, first_line, wait_all

GENERATE = "generate"  # the engine actor's concurrency group for generation, with partial rollouts


class EngineActor:
    """One engine of `GENERATION_ENGINES`, built in the actor. It counts the weight updates it has received (the
    policy version its rollouts come from) and refuses to generate in the middle of one."""

    def __init__(self, name: str, model_path: str, kwargs: dict[str, Any], segment_tokens: int = 0):
        exit_with_parent()
        self.cores = pin_to_assigned_cores()
        self.engine = build_engine(name, model_path, model_path, **kwargs)
        self.version, self.updating, self.generating, self.update_waiting = 0, False, False, False
        self.segment_tokens, self.segments_run = segment_tokens, 0
        self.turn = threading.Condition()  # orders segments and updates when they arrive on two threads

    def where(self) -> str:
        import os
        import socket

        import ray

        node = ray.get_runtime_context().get_node_id()[:8]
        cores = f", CPU cores {list(self.cores)}" if self.cores else ""
        return f"{socket.gethostname()} node {node} pid {os.getpid()} ({self.engine.device}{cores})"

    def generate_versioned(self, prompts: list[list[int]], params: SamplingParams, images: list | None = None
                           ) -> tuple[int, list[Rollout]]:
        """(the oldest policy version of the weights used, the rollouts); `images`: each prompt's (`ImageInputs` or
        None), for a vision-language model."""
        crash_point("engine_generate", self.version)
        if not self.segment_tokens:
            if self.updating:
                raise RuntimeError("generate called in the middle of a weight update (the driver must order them)")
            return self.version, self.engine.generate(prompts, params, **({"images": images} if images else {}))
        if images:
            raise ValueError("partial rollouts continue prompts segment by segment, which does not carry images yet")
        from rl.core.generation.segments import generate_in_segments

        decode = lambda ids: self.engine.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        return generate_in_segments(self._segment, prompts, params, self.segment_tokens, decode)

    def _segment(self, prompts: list[list[int]], params: SamplingParams) -> tuple[int, list[Rollout]]:
        """One segment, once no update is in progress; updates wait for it to end."""
        with self.turn:
            self.turn.wait_for(lambda: not (self.updating or self.update_waiting))
            self.generating, version = True, self.version
        try:
            return version, self.engine.generate(prompts, params)
        finally:
            with self.turn:
                self.generating, self.segments_run = False, self.segments_run + 1
                self.turn.notify_all()
            segment_delay()  # between segments, where an update may land

    def segments_done(self) -> int:
        """How many segments this engine has generated (partial rollouts)."""
        return self.segments_run

    def begin_update(self) -> None:
        """From the segment in progress (if any) to `finish_update`, no segment starts."""
        with self.turn:
            self.update_waiting = True  # the next segment waits, so an update is never starved by a long call
            self.turn.wait_for(lambda: not self.generating)
            self.updating, self.update_waiting = True, False

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.engine.update_weights(named_tensors)

    def finish_update(self, version: int) -> None:
        with self.turn:
            self.version, self.updating = version, False
            self.turn.notify_all()

    def device_keys(self) -> list[str]:
        """The device of each of the engine's workers, in worker-rank order (`shared_weights.device_key`)."""
        return self.engine.device_keys()

    def load_shared(self, handles: dict[str, Any], entries: list) -> None:
        """One bucket by handle: `handles` holds one per device its workers sit on."""
        self.engine.load_shared(handles, entries)

    def join_weight_group(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        """Joins training rank 0's process group for weights (`rl.backends.weight_stream`) as `rank`."""
        from rl.backends.dist import connect_store
        from rl.backends.weight_stream import join_group

        store = connect_store(host, port, world_size)
        self.weight_group, self.weight_backend = join_group(store, rank, world_size, backend), backend

    def receive_weights(self) -> int:
        """Loads every bucket rank 0 streams until it ends the stream; returns how many."""
        from rl.backends.weight_stream import receive_buckets

        count = 0
        for bucket in receive_buckets(self.weight_group, self.weight_backend):
            self.engine.update_weights(bucket)
            count += 1
        return count

    def offload(self) -> None:
        self.engine.offload()

    def reload(self) -> None:
        self.engine.reload()


@dataclass(eq=False)  # shares are told apart by identity
class Share:
    """One engine's part of a call: where its prompts start in the call and what it was asked (kept, so that a
    replacement engine is asked the same with the same seeds), the actor it went to and its pending result."""
    start: int
    engine: int
    prompts: list[list[int]]
    params: SamplingParams
    images: list | None
    actor: Any = None
    ref: Any = None


class RemoteEngines(GenerationEngine):
    """The driver's view of the engine actors: one `GenerationEngine` whose calls fan out to all of them."""

    def __init__(self, name: str, model_path: str, count: int, kwargs: dict[str, Any],
                 options: Callable[[int], dict[str, Any]], segment_tokens: int = 0):
        """`options(i)`: the Ray actor options that place engine i (`rl.trainer.workers.placement`); `segment_tokens` >
        0: partial rollouts, generation on a thread of its own (the actor's `generate` concurrency group)."""
        import ray

        self.segmented = segment_tokens > 0
        actor = ray.remote(concurrency_groups={GENERATE: 1})(EngineActor) if self.segmented else ray.remote(EngineActor)
        self._start = lambda i: actor.options(**options(i)).remote(name, model_path, kwargs, segment_tokens)
        self.actors = [self._start(i) for i in range(count)]
        self.places = ray.get([a.where.remote() for a in self.actors])
        self.device = ", ".join(f"engine {i}: {place}" for i, place in enumerate(self.places))
        self.timeout_s: float | None = None  # trainer.actor_call_timeout_s
        # A push and the calls of other threads (the rollout queue's episodes) reach an engine in the order they
        # are submitted from here: no call is submitted between begin_update and finish_update.
        self.gate, self.pushing = threading.Condition(), False
        self.version = 0  # the policy version every engine holds (the last finish_update)
        # Replacing a lost engine: the run's budget, the step being run (for the message), how a new actor gets the
        # policy's weights (weight_sync), the calls in flight.
        self.budget: RestartBudget | None = None
        self.step_now: Callable[[], int] = lambda: 0
        self.bring_up: Callable[[Any], None] | None = None
        self.in_flight: list[Share] = []
        self.fleet = 0  # bumped by each replacement: a weight group formed with the old actors must be formed again
        self.replacing = threading.Lock()

    @property
    def labels(self) -> list[str]:
        """What each actor is, for messages about it."""
        return [f"generation engine {i} ({place})" for i, place in enumerate(self.places)]

    def named_actors(self) -> list[tuple[Any, str]]:
        return list(zip(self.actors, self.labels, strict=True))

    def wait(self, refs: list, actors: list | None = None) -> list:
        """Results of calls on `actors` (default: one per engine, in order), within the call timeout."""
        labels = dict(zip(map(id, self.actors), self.labels, strict=True))
        names = [labels[id(a)] for a in (actors or self.actors)]
        return wait_all(refs, names, self.timeout_s)

    def generate(self, prompts: list[list[int]], params: SamplingParams, images: list | None = None
                 ) -> list[Rollout]:
        return self.collect(self.submit(prompts, params, images))[1]

    def submit(self, prompts: list[list[int]], params: SamplingParams, images: list | None = None) -> list[Share]:
        """Starts a call without waiting: the prompts (and their images, each prompt's once) split into contiguous
        shares, one per engine, each seeded of its own (or every engine would draw the same random numbers for its
        prompts)."""
        size = -(-len(prompts) // len(self.actors))
        shares = [Share(start, engine, prompts[start:start + size], params.for_part(start) if start else params,
                        images[start:start + size] if images else None)
                  for engine, start in enumerate(range(0, len(prompts), size))] if prompts else []
        with self.gate:
            self.gate.wait_for(lambda: not self.pushing)
            with self.replacing:
                for share in shares:
                    self._issue(share)
                self.in_flight.extend(shares)
        return shares

    def _issue(self, share: Share) -> None:
        share.actor = self.actors[share.engine]
        method = share.actor.generate_versioned
        method = method.options(concurrency_group=GENERATE) if self.segmented else method
        share.ref = method.remote(share.prompts, share.params, share.images)

    def collect(self, pending: list[Share]) -> tuple[list[int], list[Rollout]]:
        """Waits for a submitted call: (each share's policy version, the rollouts in prompt-major order with the
        prompt indices of the whole call)."""
        versions, rollouts = [], []
        try:
            for share in pending:
                version, part = self._result(share)
                versions.append(version)
                for rollout in part:
                    rollout.prompt_index += share.start
                    rollouts.append(rollout)
        finally:
            with self.replacing:
                self.in_flight = [share for share in self.in_flight if share not in pending]
        return versions, rollouts

    def _result(self, share: Share) -> tuple[int, list[Rollout]]:
        """A share's result; if its engine died or stopped answering, the engine replaced (which issues the share
        again) when the budget allows."""
        from ray.exceptions import RayActorError

        while True:
            actor, ref = share.actor, share.ref
            try:
                return wait_all([ref], [self.labels[share.engine]], self.timeout_s)[0]
            except (RayActorError, ActorHung) as error:
                self.replace(share.engine, actor, error)

    def replace(self, index: int, lost: Any, error: Exception) -> None:
        """Engine `index`, found dead or hung as actor `lost`, replaced and its calls in flight issued again; `error`
        raised where the budget allows no replacement. A no-op if another thread replaced `lost` already."""
        import ray

        with self.replacing:
            if self.actors[index] is not lost:
                return
            step = self.step_now()
            if self.budget is None or self.bring_up is None or not self.budget.take(ENGINE, step):
                raise error
            started, label = time.monotonic(), self.labels[index]
            ray.kill(lost, no_restart=True)  # a hung engine holds its bundle's devices until it is gone
            actor = self._start(index)
            self.places[index] = wait_all([actor.where.remote()], [f"generation engine {index}"], self.timeout_s)[0]
            self.bring_up(actor)
            wait_all([actor.finish_update.remote(self.version)], [self.labels[index]], self.timeout_s)
            self.actors[index], self.fleet = actor, self.fleet + 1
            self.budget.engines_replaced += 1
            lost_calls = [share for share in self.in_flight if share.actor is lost]
            for share in lost_calls:
                self._issue(share)
        why = (f"did not answer ({error})" if isinstance(error, ActorHung)
               else f"died ({type(error).__name__}: {first_line(error)})")
        print(f"warning: {label} {why} at step {step}; replaced in {time.monotonic() - started:.1f} s by "
              f"{self.labels[index]}; {len(lost_calls)} call(s) issued again with their seeds "
              f"({self.budget.describe(ENGINE, step)})", flush=True)

    def begin_update(self) -> None:
        """Waits for the calls already submitted to finish (with partial rollouts: for their segments in
        progress), then marks every engine as being updated; calls submitted from now wait for `finish_update`."""
        with self.gate:
            self.pushing = True
            refs = [a.begin_update.remote() for a in self.actors]
        self.wait(refs)

    def finish_update(self, version: int) -> None:
        try:
            self.wait([a.finish_update.remote(version) for a in self.actors])
            self.version = version
        finally:
            with self.gate:
                self.pushing = False
                self.gate.notify_all()

    def update_weights(self, named_tensors) -> None:
        bucket = list(named_tensors)
        self.wait([a.update_weights.remote(bucket) for a in self.actors])

    def offload(self) -> None:
        self.wait([a.offload.remote() for a in self.actors])

    def reload(self) -> None:
        self.wait([a.reload.remote() for a in self.actors])

