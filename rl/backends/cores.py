"""CPU cores an actor was given by the run's placement (`rl.trainer.workers.placement`): on a machine without GPUs, an
engine on devices of its own gets cores of its own, and the training workers share the rest. The driver passes them in
`RL_CPU_CORES` ("0,1"); the actor pins itself to them and sizes torch's thread pool to them."""

from __future__ import annotations

import os

ENV = "RL_CPU_CORES"


def encode(cores: tuple[int, ...]) -> str:
    return ",".join(str(core) for core in cores)


def pin_to_assigned_cores() -> tuple[int, ...] | None:
    """Pins this process to the cores in `RL_CPU_CORES`, if set; returns them."""
    text = os.environ.get(ENV)
    if not text:
        return None
    cores = tuple(int(core) for core in text.split(","))
    os.sched_setaffinity(0, cores)
    import torch

    torch.set_num_threads(len(cores))
    return cores
