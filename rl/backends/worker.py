"""A training worker: one rank of the SPMD group, holding the policy (and the reference, and a critic) backend.

The driver sends each data-parallel shard's micro-batches once to the ranks of that shard (its model-parallel group)
and reads the results of the rank that reports them; the worker builds its backends from the class the strategy names
(`package.module:Class`) and never looks at the strategy itself.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from rl.backends.base import DataParallelRank, ModelSpec
from rl.backends.cores import pin_to_assigned_cores
from rl.backends.dist import connect_store, host_store, init_distributed
from rl.backends.lifeline import exit_with_parent
from rl.backends.registry import build_backend
from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.algorithms.value_loss import ValueLossSettings
from rl.core.packing import PackedBatch

CRITIC_DIR = "critic"  # the critic's part of a checkpoint and of an export


class TrainingWorker:
    def __init__(self, rank: int, world_size: int, seed: int):
        exit_with_parent()
        pin_to_assigned_cores()
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.policy = self.ref = self.critic = None
        self._hosted: dist.TCPStore | None = None  # the store of the group this rank is forming as its rank 0
        self.kept: list | None = None  # rank 0's host copy of the weights last sent to the engines, when asked

    def where(self) -> str:
        """Host, Ray node and process of this rank, for the run's log and its error messages."""
        import ray

        node = ray.get_runtime_context().get_node_id()[:8]
        return f"{socket.gethostname()} node {node} pid {os.getpid()}"

    def host_rendezvous(self, world_size: int) -> tuple[str, int]:
        """Hosts the store of a group this rank forms next as its rank 0 (the training group, or the weight group with
        the engines); returns where the other members connect. Asked of rank 0."""
        self._hosted, host, port = host_store(world_size)
        return host, port

    def _group_store(self, host: str, port: int, world_size: int) -> dist.TCPStore:
        """The store of the group being formed: the one this rank hosts, or a connection to the host's."""
        store, self._hosted = self._hosted, None
        return store if store is not None else connect_store(host, port, world_size)

    def setup(self, master_addr: str, master_port: int, backend: str, policy: ModelSpec | None,
              ref: ModelSpec | None, critic: ModelSpec | None = None, timeout_s: float | None = None) -> None:
        """Builds the models this rank holds: the policy with the reference and the critic beside it, or a group of
        their own's reference or critic alone. `timeout_s`: trainer.collective_timeout_s."""
        torch.manual_seed(self.seed)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        dist_info = init_distributed(self.rank, self.world_size, master_addr, master_port, timeout_s,
                                     self._group_store(master_addr, master_port, self.world_size))
        self.policy = build_backend(backend, policy, dist_info) if policy is not None else None
        self.ref = build_backend(backend, ref, dist_info) if ref is not None else None
        self.critic = build_backend(backend, critic, dist_info) if critic is not None else None

    def data_parallel_rank(self) -> DataParallelRank:
        return (self.policy or self.ref or self.critic).data_parallel_rank()

    def logprobs(self, micro_batches: list[PackedBatch], model: str = "policy", with_entropy: bool = False
                 ) -> list[torch.Tensor] | None:
        if model == "ref" and self.ref is None:  # a LoRA policy is its own reference, adapters off
            with self.policy.reference_view():
                return self.policy.logprobs_micro_batches(micro_batches, with_entropy)
        backend = self.policy if model == "policy" else self.ref
        return backend.logprobs_micro_batches(micro_batches, with_entropy)

    def values(self, micro_batches: list[PackedBatch]) -> list[torch.Tensor] | None:
        """The critic's values of this shard's micro-batches."""
        return self.critic.values_micro_batches(micro_batches)

    def train_mini_batch(self, micro_batches: list[PackedBatch], settings: LossSettings | ValueLossSettings,
                         normalizer: LossNormalizer, model: str = "policy"
                         ) -> tuple[dict[str, float] | None, dict[str, float]]:
        """Accumulates gradients over this shard's micro-batches and steps the optimizer of `model` (the policy,
        or the critic with `ValueLossSettings`) (collective); returns the shard's metric sums (None where this rank
        does not report) and the step's grad norm and LR."""
        backend = self.critic if model == "critic" else self.policy
        metrics = backend.train_micro_batches(micro_batches, settings, normalizer)
        return metrics, backend.optimizer_step()

    def _trained(self) -> list[tuple[str, object]]:
        """(sub-folder of a checkpoint, backend) of every model this worker trains."""
        return [(folder, backend) for folder, backend in (("", self.policy), (CRITIC_DIR, self.critic))
                if backend is not None]

    def save_checkpoint(self, path: str) -> None:
        for folder, backend in self._trained():
            backend.save_checkpoint(os.path.join(path, folder) if folder else path)

    def weights_finite(self) -> bool:
        """Whether this rank's own shard of every trained model's weights is finite (no collective)."""
        return all(backend.weights_finite() for _, backend in self._trained())

    def load_checkpoint(self, path: str) -> None:
        for folder, backend in self._trained():
            backend.load_checkpoint(os.path.join(path, folder) if folder else path)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.policy.full_state_dict()

    def push_weights(self, engines: list, bucket_bytes: int) -> dict[str, float]:
        """The policy's weights to every engine actor, one bucket at a time from rank 0 (collective: the other
        ranks take part in gathering each bucket). Returns what was sent (zeros on the other ranks)."""
        import ray

        from rl.backends.weight_sync import bucket_bytes as size_of

        sent = buckets = 0
        for bucket in self._sent(self.policy.weight_buckets(bucket_bytes)):
            if self.rank == 0 and bucket:
                ray.get([engine.update_weights.remote(bucket) for engine in engines])
                sent, buckets = sent + size_of(bucket), buckets + 1
        return {"sync_bytes": float(sent), "sync_buckets": float(buckets)}

    def keep_sent_weights(self, bucket_bytes: int) -> None:
        """From now on rank 0 keeps a host copy of the weights it last sent to the engines, starting with the ones
        it holds now (collective): an engine that replaces a lost one while the policy trains ahead of the engines
        (rollouts queued ahead) gets the version its calls were issued under (`push_sent_weights`)."""
        self.kept = []
        for _ in self._sent(self.policy.weight_buckets(bucket_bytes)):
            pass

    def _sent(self, buckets):
        """The buckets as they go to the engines; when keeping them, rank 0 copies each to the host, and the copy
        replaces the kept one once the last bucket went out."""
        if self.kept is None or self.rank != 0:
            yield from buckets
            return
        copy = []
        for bucket in buckets:
            if bucket:
                copy.append([(name, tensor.detach().to("cpu", copy=True)) for name, tensor in bucket])
            yield bucket
        self.kept = copy

    def push_sent_weights(self, engines: list, bucket_bytes: int) -> dict[str, float]:
        """The weights last sent to the engines (kept: `keep_sent_weights`), else the ones this policy holds, to
        `engines` through Ray's object store (collective where nothing is kept)."""
        import ray

        if self.kept is None:
            return self.push_weights(engines, bucket_bytes)
        for bucket in self.kept if self.rank == 0 else []:
            ray.get([engine.update_weights.remote(bucket) for engine in engines])
        return {"sync_bytes": 0.0, "sync_buckets": 0.0}

    def device_key(self) -> str:
        """Where this worker's policy weights live (`shared_weights.device_key`; in an emulated run its slot, which
        is its rank: `rl.trainer.workers.placement`)."""
        from rl.core.generation.shared_weights import device_key

        return device_key(self.policy.dist.device, self.rank)

    def gathers_on_every_rank(self) -> bool:
        """Whether the policy's strategy yields its weight buckets on every rank (`weight_sync.device_buckets`)."""
        from rl.backends.weight_sync import gathers_on_every_rank

        return gathers_on_every_rank(self.policy)

    def share_weights(self, engines: list, bucket_bytes: int, feeders: tuple[tuple[int, ...], ...] | None = None
                      ) -> dict[str, float]:
        """The policy's weights to every engine actor, one bucket at a time, shared by handle (`shared_weights`:
        CUDA IPC on a GPU, /dev/shm on the host): Ray carries only handles and layouts. `feeders[i][k]` is the rank
        feeding engine i's worker k (`rl.trainer.rollout.engine_feeds`; None: rank 0 feeds them all). Collective;
        returns what was sent (zeros on the other ranks)."""
        feeders = feeders or tuple((0,) for _ in engines)
        if {rank for ranks in feeders for rank in ranks} == {0}:
            return self._share_from_rank0(engines, bucket_bytes)
        return self._share_from_every_rank(engines, bucket_bytes, feeders)

    def _share_from_rank0(self, engines: list, bucket_bytes: int) -> dict[str, float]:
        import ray

        from rl.core.generation.shared_weights import shared

        sent = buckets = 0
        for bucket in self._sent(self.policy.weight_buckets(bucket_bytes)):
            if self.rank != 0 or not bucket:
                continue
            with shared(bucket, self.policy.dist.device, self.device_key()) as (handles, entries, size):
                del bucket
                ray.get([engine.load_shared.remote(handles, entries) for engine in engines])
            sent, buckets = sent + size, buckets + 1
        return {"sync_bytes": float(sent), "sync_buckets": float(buckets)}

    def _share_from_every_rank(self, engines: list, bucket_bytes: int, feeders: tuple[tuple[int, ...], ...]
                               ) -> dict[str, float]:
        """Every rank gathers each bucket on its own device (`device_buckets`); each feeding rank shares its copy
        there, the handles are exchanged (one all-gather of a few bytes per rank), and the rank feeding an
        engine's first worker hands the engine the handles of all its workers' ranks. A barrier keeps every buffer
        until every engine has loaded from it."""
        import contextlib

        import ray
        import torch.distributed as dist

        from rl.core.generation.shared_weights import layout, shared

        feeds = any(self.rank in ranks for ranks in feeders)
        leads = [index for index, ranks in enumerate(feeders) if ranks[0] == self.rank]
        sent = buckets = 0
        for bucket in self._sent(self.policy.device_buckets(bucket_bytes)):
            sharing = (shared(bucket, self.policy.dist.device, self.device_key()) if feeds
                       else contextlib.nullcontext((None, *layout(bucket))))
            with sharing as (handles, entries, size):
                del bucket
                everyone: list = [None] * self.world_size
                dist.all_gather_object(everyone, handles)
                ray.get([engines[index].load_shared.remote(
                    {key: handle for rank in feeders[index] for key, handle in everyone[rank].items()}, entries)
                    for index in leads])
                dist.barrier()
            sent, buckets = sent + size, buckets + 1
        first = self.rank == 0
        return {"sync_bytes": float(sent if first else 0), "sync_buckets": float(buckets if first else 0)}

    def join_weight_group(self, host: str, port: int, world_size: int, backend: str) -> None:
        """Rank 0 joins the process group of the engine actors as its rank 0 (`weight_stream`)."""
        from rl.backends.weight_stream import join_group

        store = self._group_store(host, port, world_size)
        self.weight_group, self.weight_backend = join_group(store, 0, world_size, backend), backend

    def stream_weights(self, bucket_bytes: int) -> dict[str, float]:
        """The policy's weights to the engines over the weight group, one bucket at a time from rank 0 (collective:
        the other ranks take part in gathering each bucket). Returns what was sent (zeros on the other ranks)."""
        from rl.backends.weight_stream import send_bucket, send_end

        sent = buckets = 0
        for bucket in self._sent(self.policy.weight_buckets(bucket_bytes)):
            if self.rank == 0 and bucket:
                sent, buckets = sent + send_bucket(self.weight_group, self.weight_backend, bucket), buckets + 1
        if self.rank == 0:
            send_end(self.weight_group, self.weight_backend)
        return {"sync_bytes": float(sent), "sync_buckets": float(buckets)}

    def export_hf(self, model_path: str, output_dir: str) -> None:
        """Hugging Face weights; for a LoRA policy a PEFT adapter folder, with the merged weights in `merged/` when
        trainer.policy.model.lora.merge_on_export. The folder appears complete or not at all."""
        from rl.backends.hf_model import save_hf_checkpoint

        lora = self.policy.spec.lora
        if not lora:
            state = self.policy.full_state_dict()
            if self.rank == 0:
                save_hf_checkpoint(model_path, state, output_dir)
            return
        from rl.backends.lora import save_adapter

        adapters = self.policy.adapter_state_dict()
        merged = self.policy.full_state_dict() if lora["merge_on_export"] else None
        if self.rank == 0:
            staging = output_dir.rstrip("/") + ".partial"
            save_adapter(staging, adapters, lora, model_path)
            if merged is not None:
                save_hf_checkpoint(model_path, merged, os.path.join(staging, "merged"))
            if os.path.isdir(output_dir):
                raise FileExistsError(f"{output_dir} already exists; exports are never overwritten")
            os.replace(staging, output_dir)

    def export_critic(self, model_path: str, output_dir: str) -> None:
        """The critic as a one-label token classifier (`rl.backends.value_head`); the folder appears complete or
        not at all."""
        from rl.backends.hf_model import save_hf_checkpoint

        state = self.critic.full_state_dict()
        if self.rank == 0:  # the critic's own config and tokenizer (the policy's, unless it started from a critic)
            save_hf_checkpoint(self.critic.spec.path, state, output_dir, critic=True)
