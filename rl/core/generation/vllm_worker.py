"""Methods vLLM adds to each of its workers (`worker_extension_cls`), called through `LLM.collective_rpc`. Weights go
in through the model runner's weight reload (vLLM's own name mapping, fused projections and, on CPU, the repacking
its kernels need)."""

from __future__ import annotations


class WeightLoader:
    def load_weight_file(self, path: str) -> int:
        """A bucket from a safetensors file."""
        from safetensors.torch import load_file

        weights = load_file(path)
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
        return len(weights)

    def device_key(self) -> str:
        """This worker's device (`shared_weights.device_key`); in an emulated run its placement slot's."""
        import torch

        from rl.core.generation.shared_weights import device_key, engine_worker_slot

        # "cuda": this worker's current GPU; self.rank: its rank within the engine (TP rank order)
        return device_key("cuda" if torch.cuda.is_available() else "cpu", engine_worker_slot(self.rank))

    def load_shared_bucket(self, handles: dict, entries: list) -> int:
        """A bucket shared by handle (`rl.core.generation.shared_weights`), mapped on this worker's device."""
        import torch

        from rl.core.generation.shared_weights import load_shared

        bucket = load_shared(handles, entries, self.device_key())
        self.model_runner.reload_weights(weights_iterator=iter(bucket))
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # done reading before the sender frees the buffer
        return len(bucket)
