"""Methods vLLM adds to each of its workers (`worker_extension_cls`), called through `LLM.collective_rpc`."""

from __future__ import annotations


class WeightLoader:
    """Loads a bucket of Hugging Face-named tensors from a safetensors file into the worker's model, through the
    model runner's weight reload (vLLM's own name mapping, fused projections and, on CPU, the repacking its
    kernels need)."""

    def load_weight_file(self, path: str) -> int:
        from safetensors.torch import load_file

        weights = load_file(path)
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
        return len(weights)
