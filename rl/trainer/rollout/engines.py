"""Generation engines in Ray actors (`generator.backend=vllm`, or any engine with
`trainer.placement.colocate_all=false`): `generator.num_inference_engines` of them, the prompts of a call split
evenly between them, and the weights sent to them by the training workers in buckets (`rl.trainer.rollout.weight_sync`:
by handle from the ranks on their devices, or from rank 0), never through the driver. Calls can be started and
collected later (`submit`/`collect`), which is how generation overlaps training (`rl.trainer.rollout.rollout_queue`).

With partial rollouts (`trainer.fully_async.partial_rollout_tokens` > 0) a call runs in segments
(`rl.core.generation.segments`) on a driver thread of its own, each segment an ordinary call to the engines: an
update waits for the segment in progress (an actor runs its calls in order), and the next segment waits for the
update (`gate`), so new weights land mid-call; and an engine lost mid-call costs only the segment in progress.

An engine that dies or stops answering during a generation call, or while a weight update waits for its calls, is
replaced on its own (`trainer.max_restarts` engine replacements): a new actor in the same placement bundle, brought
to the policy version the others hold by a push from training rank 0 (`bring_up`, set by the weight sync: the
weights rank 0 last sent, kept on its host where the policy may train ahead of the engines), and every call in
flight on the lost engine issued again to it with the same prompts and seeds. Rollouts depend only on the seed, the
weights and the prompts, so the step's rollouts are the ones the lost engine would have returned."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from rl.backends.cores import pin_to_assigned_cores
from rl.backends.lifeline import exit_with_parent
from rl.core.generation import GenerationEngine, Rollout, SamplingParams, build_engine
from rl.core.generation.segments import generate_in_segments
from rl.trainer.state.faults import crash_point, segment_delay
from rl.trainer.workers.restarts import ENGINE, RestartBudget
from rl.trainer.workers.waiting import ActorHung, first_line, in_daemon_thread, wait_all


class EngineActor:
    """One engine of `GENERATION_ENGINES`, built in the actor. It counts the weight updates it has received (the
    policy version its rollouts come from) and refuses to generate in the middle of one."""

    def __init__(self, name: str, model_path: str, kwargs: dict[str, Any]):
        exit_with_parent()
        self.cores = pin_to_assigned_cores()
        self.engine = build_engine(name, model_path, model_path, **kwargs)
        self.version, self.updating, self.calls = 0, False, 0

    def where(self) -> str:
        import os
        import socket

        import ray

        node = ray.get_runtime_context().get_node_id()[:8]
        cores = f", CPU cores {list(self.cores)}" if self.cores else ""
        return f"{socket.gethostname()} node {node} pid {os.getpid()} ({self.engine.device}{cores})"

    def generate_versioned(self, prompts: list[list[int]], params: SamplingParams, images: list | None = None
                           ) -> tuple[int, list[Rollout]]:
        """(the policy version of the weights used, the rollouts); `images`: each prompt's (`ImageInputs` or None),
        for a vision-language model."""
        crash_point("engine_generate", self.version)
        if self.updating:
            raise RuntimeError("generate called in the middle of a weight update (the driver must order them)")
        self.calls += 1
        return self.version, self.engine.generate(prompts, params, **({"images": images} if images else {}))

    def calls_served(self) -> int:
        """How many generation calls this engine has run."""
        return self.calls

    def begin_update(self) -> None:
        """Runs after the calls submitted before it (an actor runs its calls in order); no call may run until
        `finish_update`."""
        self.updating = True

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.engine.update_weights(named_tensors)

    def finish_update(self, version: int) -> None:
        self.version, self.updating = version, False

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
        0: partial rollouts, each call in segments of that many tokens on a driver thread of its own."""
        import ray

        self.segment_tokens, self.segments_collected = segment_tokens, 0
        self.line, self.tickets, self.serving = threading.Condition(), 0, 0  # segmented calls in submission order
        self.decode: Callable[[Any], str] | None = None  # response ids to text, for segments (the tokenizer's)
        if segment_tokens:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
            self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
        actor = ray.remote(EngineActor)
        self._start = lambda i: actor.options(**options(i)).remote(name, model_path, kwargs)
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

    def submit(self, prompts: list[list[int]], params: SamplingParams, images: list | None = None
               ) -> list[Share] | Future:
        """Starts a call without waiting (with partial rollouts, its segments one after another on a thread of
        their own)."""
        if not self.segment_tokens:
            return self._submit_shares(prompts, params, images)
        if images:
            raise ValueError("partial rollouts continue prompts segment by segment, which does not carry images yet")
        with self.line:
            ticket, self.tickets = self.tickets, self.tickets + 1
        return in_daemon_thread(lambda: self._in_turn(ticket, prompts, params), "segments")

    def _in_turn(self, ticket: int, prompts: list[list[int]], params: SamplingParams) -> tuple[int, list[Rollout]]:
        """A segmented call, once the calls submitted before it are done (calls run one after another, as whole
        calls do on an engine)."""
        with self.line:
            self.line.wait_for(lambda: self.serving == ticket)
        try:
            return generate_in_segments(self._segment, prompts, params, self.segment_tokens, self.decode)
        finally:
            with self.line:
                self.serving += 1
                self.line.notify_all()

    def _segment(self, prompts: list[list[int]], params: SamplingParams) -> tuple[int, list[Rollout]]:
        """One segment of a call: (the policy version it ran on, its rollouts)."""
        versions, rollouts = self._collect_shares(self._submit_shares(prompts, params))
        self.segments_collected += 1
        segment_delay()  # between segments, where an update may land
        return min(versions), rollouts

    def _submit_shares(self, prompts: list[list[int]], params: SamplingParams, images: list | None = None
                       ) -> list[Share]:
        """The prompts (and their images, each prompt's once) split into contiguous shares, one per engine, each
        seeded of its own (or every engine would draw the same random numbers for its prompts)."""
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
        share.ref = share.actor.generate_versioned.remote(share.prompts, share.params, share.images)

    def collect(self, pending: list[Share] | Future) -> tuple[list[int], list[Rollout]]:
        """Waits for a submitted call: (the policy version of each of its parts, the rollouts in prompt-major order
        with the prompt indices of the whole call)."""
        if isinstance(pending, Future):
            oldest, rollouts = pending.result()
            return [oldest], rollouts
        return self._collect_shares(pending)

    def _collect_shares(self, pending: list[Share]) -> tuple[list[int], list[Rollout]]:
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
        return self._outliving(share.engine, share.actor, share.ref, lambda: (share.actor, share.ref))

    def _outliving(self, index: int, actor: Any, ref: Any, again: Callable[[], tuple[Any, Any]]) -> Any:
        """The result of `ref`, a call on engine `index` (actor `actor`); an engine that dies or stops answering
        first is replaced (`replace`: its calls in flight issued again), and `again()` names the (actor, call) to
        wait on instead."""
        from ray.exceptions import RayActorError

        while True:
            try:
                return wait_all([ref], [self.labels[index]], self.timeout_s)[0]
            except (RayActorError, ActorHung) as error:
                self.replace(index, actor, error)
                actor, ref = again()

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
        """Waits for the calls already submitted to finish (with partial rollouts: their segments in progress),
        then marks every engine as being updated; calls submitted from now wait for `finish_update`. An
        engine lost in the wait is replaced (its calls issued again) and waited for in turn."""
        with self.gate:
            self.pushing = True
            actors = list(self.actors)
            refs = [a.begin_update.remote() for a in actors]
        for index, (actor, ref) in enumerate(zip(actors, refs, strict=True)):
            self._outliving(index, actor, ref, lambda index=index: (self.actors[index],
                                                                    self.actors[index].begin_update.remote()))

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

