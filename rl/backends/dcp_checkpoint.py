"""Sharded checkpoints with torch.distributed.checkpoint (DCP): each rank writes its own shards of the model and
optimizer; the LR schedule, identical on every rank, is written once. Shared by the PyTorch-sharded strategies."""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from rl.backends.lora import is_adapter, with_base, write_adapter_config

SCHEDULER_FILE = "scheduler.pt"


class DCPCheckpointMixin:
    """save_checkpoint / load_checkpoint for a backend with `model`, `optimizer`, `scheduler` and `dist`."""

    def _state_options(self) -> StateDictOptions:
        # A LoRA policy's checkpoint holds its adapters (and their optimizer state); the base stays at model.path.
        lora = bool(self.spec.lora)
        return StateDictOptions(ignore_frozen_params=lora, strict=not lora)

    def _states(self, options: StateDictOptions):
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=options)
        if self.spec.lora:  # a tied LM head shows up under its own name although frozen: adapters only
            model_state = {name: value for name, value in model_state.items() if is_adapter(name)}
        return model_state, optim_state

    def save_checkpoint(self, path: str) -> None:
        model_state, optim_state = self._states(self._state_options())
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
        if self.dist.is_main:
            torch.save(self.scheduler.state_dict(), os.path.join(path, SCHEDULER_FILE))
            if self.spec.lora:  # the adapters' shape, for readers of the checkpoint (rl.launch.convert)
                write_adapter_config(path, self.spec.lora, self.spec.path)

    def load_checkpoint(self, path: str) -> None:
        options = self._state_options()
        model_state, optim_state = self._states(options)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=options)
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
