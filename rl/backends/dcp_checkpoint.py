"""Sharded checkpoints with torch.distributed.checkpoint (DCP): each rank writes its own shards of the model and
optimizer; the LR schedule, identical on every rank, is written once. Shared by the PyTorch-sharded strategies."""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from rl.backends.lora import trains_with_adapters, with_base, write_adapter_config

SCHEDULER_FILE = "scheduler.pt"


class DCPCheckpointMixin:
    """save_checkpoint / load_checkpoint for a backend with `model`, `optimizer`, `scheduler` and `dist`."""

    def _state_options(self) -> StateDictOptions:
        # A LoRA policy's checkpoint holds its adapters (and their optimizer state); the base stays at model.path.
        lora = bool(self.spec.lora)
        return StateDictOptions(ignore_frozen_params=lora, strict=not lora)

    def _states(self, options: StateDictOptions, with_optimizer: bool = True):
        """(model state, optimizer state or None). Without `with_optimizer` the optimizer is left alone:
        `get_state_dict` gives an optimizer that never stepped its state by stepping it once with zero gradients
        (`_init_optim_state`), which counts as Adam's first step and changes the real first update's bias
        correction; a model checkpointed before its first step (a policy during the critic's warm-up) must train
        as one never checkpointed."""
        if with_optimizer:
            model_state, optim_state = get_state_dict(self.model, self.optimizer, options=options)
        else:
            model_state, optim_state = get_model_state_dict(self.model, options=options), None
        if self.spec.lora:  # a tied LM head shows up under its own name although frozen: what trains only
            model_state = {name: value for name, value in model_state.items()
                           if trains_with_adapters(name, self.is_critic)}
        return model_state, optim_state

    def save_checkpoint(self, path: str) -> None:
        stepped = bool(self.optimizer.state)  # before the first step there is no optimizer state to keep
        model_state, optim_state = self._states(self._state_options(), with_optimizer=stepped)
        dcp.save({"model": model_state, **({"optim": optim_state} if stepped else {})}, checkpoint_id=path)
        if self.dist.is_main:
            torch.save(self.scheduler.state_dict(), os.path.join(path, SCHEDULER_FILE))
            if self.spec.lora:  # the adapters' shape, for readers of the checkpoint (rl.launch.convert)
                write_adapter_config(path, self.spec.lora, self.spec.path)

    def load_checkpoint(self, path: str) -> None:
        options = self._state_options()
        listed = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        stepped = any(key.startswith("optim.") for key in listed)  # saved before its first step: the model alone
        model_state, optim_state = self._states(options, with_optimizer=stepped)
        state = {"model": model_state, **({"optim": optim_state} if stepped else {})}
        dcp.load(state, checkpoint_id=path)
        if stepped:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"], options=options)
        else:
            set_model_state_dict(self.model, state["model"], options=options)
        self.scheduler.load_state_dict(torch.load(os.path.join(path, SCHEDULER_FILE), weights_only=True))

    @classmethod
    def checkpoint_weights(cls, path: str, model_path: str) -> dict[str, Tensor]:
        """Every rank's model shards merged, in one process: the tensors the metadata lists under `model`."""
        if not os.path.isfile(os.path.join(path, ".metadata")):
            raise FileNotFoundError(f"{path} has no .metadata: not a checkpoint of a torch.distributed.checkpoint "
                                    "strategy")
        listed = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        model = {key.removeprefix("model."): torch.empty(entry.size, dtype=entry.properties.dtype)
                 for key, entry in listed.items()
                 if key.startswith("model.") and isinstance(entry, TensorStorageMetadata)}
        with warnings.catch_warnings():  # that it loads in one process is the point here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({"model": model}, checkpoint_id=path, no_dist=True)
        return with_base(path, model_path, model)
