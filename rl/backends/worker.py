"""A training worker: one rank of the SPMD group, holding the policy (and the reference) backend.

The driver calls the same method on every worker with that rank's micro-batches; the worker never looks at the
strategy name beyond building its backends through the registry.
"""

from __future__ import annotations

import os
import socket

import torch

from rl.backends.base import ModelSpec
from rl.backends.dist import all_reduce_sum, init_distributed
from rl.backends.registry import build_backend
from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.packing import PackedBatch


class TrainingWorker:
    def __init__(self, rank: int, world_size: int, seed: int):
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.policy = self.ref = None

    def address(self) -> tuple[str, int]:
        """(host, free port) for the rendezvous; asked of rank 0."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            return socket.gethostbyname(socket.gethostname()), sock.getsockname()[1]

    def setup(self, master_addr: str, master_port: int, strategy: str, policy: ModelSpec, ref: ModelSpec | None
              ) -> None:
        torch.manual_seed(self.seed)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        dist_info = init_distributed(self.rank, self.world_size, master_addr, master_port)
        self.policy = build_backend(strategy, policy, dist_info)
        self.ref = build_backend(strategy, ref, dist_info) if ref is not None else None

    def logprobs(self, micro_batches: list[PackedBatch], model: str = "policy", with_entropy: bool = False
                 ) -> list[torch.Tensor]:
        backend = self.policy if model == "policy" else self.ref
        return [backend.logprobs(batch, with_entropy)[0] for batch in micro_batches]

    def train_mini_batch(self, micro_batches: list[PackedBatch], settings: LossSettings, normalizer: LossNormalizer
                         ) -> dict[str, float]:
        """Accumulates gradients over the micro-batches, steps the optimizer, returns mini-batch metrics."""
        totals: dict[str, float] = {}
        for i, batch in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            for name, value in self.policy.forward_backward(batch, settings, normalizer, last).items():
                totals[name] = totals.get(name, 0.0) + value
        names = sorted(totals)
        summed = dict(zip(names, all_reduce_sum([totals[n] for n in names], self.policy.dist.device), strict=True))
        summed.update(self.policy.optimizer_step())
        return summed

    def save_checkpoint(self, path: str) -> None:
        self.policy.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self.policy.load_checkpoint(path)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.policy.full_state_dict()

    def export_hf(self, model_path: str, output_dir: str) -> None:
        from rl.backends.hf_model import save_hf_checkpoint

        state = self.policy.full_state_dict()
        if self.rank == 0:
            save_hf_checkpoint(model_path, state, output_dir)
