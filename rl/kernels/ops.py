"""One dispatch for every kernel op: CUDA, Triton or the torch reference, by device, availability and the
`trainer.kernels` setting (auto | torch | triton | cuda).

``auto`` picks CUDA on a CUDA tensor when the extension is built, else Triton when it imports, else torch; on CPU
it is torch. Forcing ``triton`` or ``cuda`` on a CPU tensor raises, naming trainer.kernels (Triton is allowed on CPU
under TRITON_INTERPRET=1, for tests).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from types import ModuleType

import torch
from torch import Tensor

from rl.kernels import reference

CHOICES = ("auto", "torch", "triton", "cuda")


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def cuda_extension_available() -> bool:
    from rl.kernels.cuda.loader import load

    return load() is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def resolve(kernels: str, tensor: Tensor) -> str:
    """The implementation ('torch', 'triton' or 'cuda') that runs an op on `tensor` under `trainer.kernels`."""
    if kernels not in CHOICES:
        raise ValueError(f"trainer.kernels must be one of {CHOICES}, got '{kernels}'")
    on_cuda = tensor.device.type == "cuda"
    if kernels == "auto":
        # the CUDA kernels take fp32/bf16 floats (packing: any dtype); Triton's are generic over the float type
        cuda_dtype = not tensor.dtype.is_floating_point or tensor.dtype in (torch.float32, torch.bfloat16)
        if on_cuda and cuda_dtype and cuda_extension_available():
            return "cuda"
        if on_cuda and triton_available():
            return "triton"
        return "torch"
    if kernels == "triton":
        if not triton_available():
            raise RuntimeError("trainer.kernels=triton but triton is not installed; use trainer.kernels=auto or torch")
        if not on_cuda and not _interpreting():
            raise ValueError(
                f"trainer.kernels=triton needs CUDA tensors, got a {tensor.device.type} tensor; use "
                "trainer.kernels=auto or torch on this device (or TRITON_INTERPRET=1 to emulate on CPU)"
            )
    if kernels == "cuda" and not on_cuda:
        raise ValueError(
            f"trainer.kernels=cuda needs CUDA tensors, got a {tensor.device.type} tensor; use trainer.kernels=auto "
            "or torch on this device"
        )
    return kernels


def backend(kernels: str, tensor: Tensor) -> ModuleType:
    """The module implementing the ops for `resolve(kernels, tensor)`; all share the reference's signatures."""
    choice = resolve(kernels, tensor)
    if choice == "cuda":
        from rl.kernels.cuda import ext

        return ext
    if choice == "triton":
        from rl.kernels.triton import ops

        return ops
    return reference


def cu_seqlens_from_lengths(lengths: Tensor, kernels: str = "auto") -> Tensor:
    return backend(kernels, lengths).cu_seqlens_from_lengths(lengths)


def position_ids(cu_seqlens: Tensor, kernels: str = "auto") -> Tensor:
    return backend(kernels, cu_seqlens).position_ids(cu_seqlens)


def pack(padded: Tensor, lengths: Tensor, kernels: str = "auto") -> Tensor:
    return backend(kernels, padded).pack(padded, lengths.to(padded.device))


def unpack(packed: Tensor, lengths: Tensor, width: int, pad_value: float = 0, kernels: str = "auto") -> Tensor:
    return backend(kernels, packed).unpack(packed, lengths.to(packed.device), width, pad_value)


def token_logprobs_entropy(logits: Tensor, targets: Tensor, temperature: float = 1.0, kernels: str = "auto",
                           with_entropy: bool = True):
    """(logprob [N], entropy [N]) fp32 of softmax(logits / temperature) at `targets`; differentiable. With
    `with_entropy=False` the entropy is None: the torch path skips its work, the GPU kernels (memory-bound, one pass
    for both) drop it."""
    impl = backend(kernels, logits)
    if impl is reference:
        return reference.token_logprobs_entropy(logits, targets, temperature, with_entropy=with_entropy)
    logprob, entropy = impl.token_logprobs_entropy(logits, targets, temperature)
    return logprob, (entropy if with_entropy else None)


def fused_policy_loss(
    settings,
    logits: Tensor,
    targets: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    normalizer,
    *,
    kernels: str = "auto",
    **options,
):
    """`compute_policy_loss` fused with the token logprobs: logits in, (loss, metrics) out, gradient to logits."""
    return backend(kernels, logits).fused_policy_loss(
        settings, logits, targets, old_logprobs, advantages, loss_mask, normalizer, **options
    )


def chunked_token_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float = 1.0, chunk_size: int | None = None
):
    """(logprob, entropy) from hidden states and the LM-head weight, a chunk of tokens at a time (torch on every
    device: the chunk's matmul dominates and is already a vendor kernel)."""
    return reference.chunked_token_logprobs(hidden, weight, targets, temperature, chunk_size)


def chunked_policy_loss(
    settings,
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    loss_mask: Tensor,
    normalizer,
    *,
    kernels: str = "auto",
    **options,
):
    """The policy loss from hidden states and the LM-head weight without the full [N, V] logits: each chunk's
    logits are one matmul, then the `trainer.kernels` implementation's loss (the fused Triton/CUDA kernel on GPU,
    in-place torch on CPU) gives the chunk's gradient. Options: those of `reference.chunked_policy_loss`."""
    impl = backend(kernels, hidden)
    if impl is reference:
        return reference.chunked_policy_loss(
            settings, hidden, weight, targets, old_logprobs, advantages, loss_mask, normalizer, **options
        )
    from rl.kernels.autograd import kernel_chunked_policy_loss

    return kernel_chunked_policy_loss(
        impl.KERNELS, settings, hidden, weight, targets, old_logprobs, advantages, loss_mask, normalizer, **options
    )
