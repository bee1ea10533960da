"""Runs megatron-core 0.16.1 on the CPU with gloo: the one place this project bends megatron-core.

megatron-core assumes CUDA in a few places on the path this backend uses (local layer spec, no Transformer Engine or
Apex, fusions off). `cpu_compat()` is a context manager that, only when the device is the CPU, swaps these
module attributes for the time it is active and restores them on exit (megatron-core's files are never touched):

1. `torch` inside the modules in `_TORCH_PROXIED` -> `_CpuTorch`: a stand-in for the torch module whose
   `torch.cuda.current_device()` is the CPU, `torch.cuda.synchronize()` does nothing, `torch.cuda.get_rng_state /
   set_rng_state / manual_seed` act on the CPU generator, `torch.cuda.Stream / current_stream / stream` are no-op
   stand-ins (the MoE all-to-all dispatcher's device-to-host side stream), and tensor factories (`zeros`, `empty`,
   `ones`, `full`, `tensor`, `arange`) map `device="cuda"` to the CPU. Covers: the global memory buffer
   (`utils`), the sequence-parallel gather and reduce-scatter buffers (`tensor_parallel.layers`, `.mappings`),
   `total_num_tokens` and p2p shape buffers in the pipeline schedules, RoPE frequencies, MoE router/expert buffers.
2. `tensor_parallel.random._get_cuda_rng_state / _set_cuda_rng_state` -> the CPU generator's state, so the CUDA RNG
   tracker (`model_parallel_cuda_manual_seed`, `get_cuda_rng_tracker().fork()`) keeps its named streams on the CPU.
3. `LanguageModule.setup_embeddings_and_output_layer`: with tied embeddings and PP > 1 it moves the output weight
   with `Tensor.cuda()` before syncing it across the embedding group; the replacement does the same sync on the CPU.
4. `transformer.moe.token_dispatcher.maybe_move_tensor_to_cpu`: returns the all-to-all split sizes as numpy only for
   CUDA tensors; on the CPU they stayed tensors, which `torch.distributed.all_to_all_single` rejects. The
   replacement converts CPU tensors too when numpy is asked for.
5. `transformer.moe.moe_utils.te_general_gemm = None` when Transformer Engine is absent (on any device): 0.16.1
   imports it only with TE but tests it unguarded in the MoE router's gating linear (a NameError without TE).
6. Item 1's proxy also covers megatron's DDP wrapper and optimizers: `distributed.param_and_grad_buffer` (the
   contiguous param and grad buffers on `torch.cuda.current_device()`), `optimizer.optimizer` (the unit loss scale
   and overflow flags on "cuda"), `optimizer.clip_grads` (the norm accumulators on "cuda") and
   `optimizer.distrib_optimizer` (the optimizer-state placeholders it allocates when loading a state dict).
7. `optimizer.distrib_optimizer.DistributedOptimizer._build_model_and_main_param_groups` takes its fp32 branch only
   when `param.type() == "torch.cuda.FloatTensor"` and raises TypeError for any other type. The replacement runs the
   original while the CPU fp32 parameters it is given report that type name (an instance attribute shadowing
   `Tensor.type`, removed after the call); the fp32 branch itself only slices views, so it is device-independent.
8. `clip_grad_by_total_norm_fp32` (megatron's grad clipping; the name is bound in `optimizer.clip_grads` and
   `optimizer.optimizer`) asserts `param.grad.type() == "torch.cuda.FloatTensor"`; the replacement runs the
   original while the CPU fp32 gradients report that type name, the same way as item 7.

Not patched: `optimizer.cpu_offloading.HybridDeviceOptimizer` (megatron's `optimizer_cpu_offload`), which the
backend does not use on any device (why: optimizer.py).
Not patches but layer-spec choices, made on every device: THD core attention (attention.py; the local
`DotProductAttention` rejects packed sequences) and an RMSNorm that allows sequence parallelism (norm.py).
The layer checks the installed megatron-core version equals PINNED_VERSION (the lock's pin) before patching.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
import types

import torch
import torch.distributed as dist

PINNED_VERSION = "0.16.1"
"""megatron-core version these patches were written against; third_party/python/requirements_lock.txt pins it."""

_TORCH_PROXIED = (
    "megatron.core.utils",
    "megatron.core.tensor_parallel.random",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.transformer.transformer_layer",
    "megatron.core.transformer.moe.router",
    "megatron.core.transformer.moe.experts",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.transformer.moe.token_dispatcher",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.distrib_optimizer",
)
_FACTORIES = ("zeros", "empty", "ones", "full", "tensor", "arange")
_lock = threading.RLock()
_depth = 0
_saved: list[tuple[object, str, object]] = []


def installed_version() -> str:
    from megatron.core import package_info

    return package_info.__version__


def check_version() -> None:
    found = installed_version()
    if found != PINNED_VERSION:
        raise RuntimeError(
            f"megatron-core {found} is installed, but rl/backends/megatron/cpu_compat.py was written for "
            f"{PINNED_VERSION} (the pin in third_party/python/requirements_lock.txt). Install megatron-core=="
            f"{PINNED_VERSION}, or re-check each patch listed in cpu_compat.py against {found} and update "
            "PINNED_VERSION together with the lock."
        )


def _to_cpu(device):
    if isinstance(device, int) or (device is not None and torch.device(device).type == "cuda"):
        return "cpu"
    return device


def _cpu_factory(fn):
    def make(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _to_cpu(kwargs["device"])
        kwargs.pop("pin_memory", None)
        return fn(*args, **kwargs)

    return make


class _NullStream:
    """Stands in for a CUDA stream: CPU work is ordered already."""

    def wait_stream(self, *args, **kwargs):
        return None

    def synchronize(self):
        return None

    def record_event(self, *args, **kwargs):
        return self  # an "event" whose synchronize()/wait() return at once

    def wait(self, *args, **kwargs):
        return None

    def query(self):
        return True


_NULL_STREAM = _NullStream()


class _CpuCuda(types.SimpleNamespace):
    """`torch.cuda` as the proxied modules see it: the current device is the CPU, RNG calls use the CPU generator."""

    def __getattr__(self, name):
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device():
        return torch.device("cpu")

    @staticmethod
    def synchronize(*args, **kwargs):
        return None

    @staticmethod
    def get_rng_state(*args, **kwargs):
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state, *args, **kwargs):
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed):
        torch.manual_seed(seed)

    @staticmethod
    def Stream(*args, **kwargs):
        return _NULL_STREAM

    @staticmethod
    def current_stream(*args, **kwargs):
        return _NULL_STREAM

    @staticmethod
    def stream(_stream):
        return contextlib.nullcontext()


class _CpuTorch(types.ModuleType):
    """The torch module as the proxied modules see it (see the module docstring, item 1)."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = _CpuCuda()
        for name in _FACTORIES:
            setattr(self, name, _cpu_factory(getattr(torch, name)))

    def __getattr__(self, name):
        return getattr(torch, name)


def _get_rng_state(*args, **kwargs):
    return torch.get_rng_state()


def _set_rng_state(state, *args, **kwargs):
    torch.set_rng_state(state)


def _splits_to_numpy(original):
    """maybe_move_tensor_to_cpu that also turns CPU tensors into numpy when asked (item 4)."""

    def move(tensor, as_numpy: bool = False, record_stream: bool = False):
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    return move


def _setup_embeddings_on_cpu(original):
    """LanguageModule.setup_embeddings_and_output_layer without `Tensor.cuda()` (item 3)."""

    def setup(self) -> None:
        in_group = self._is_in_embd_group()
        self._is_in_embd_group = lambda: False  # instance attribute: skips the original's CUDA sync
        try:
            original(self)
        finally:
            del self._is_in_embd_group
        if in_group and dist.is_initialized():
            dist.all_reduce(self.shared_embedding_or_output_weight().data, group=self.embd_group)

    return setup


_CUDA_FLOAT = "torch.cuda.FloatTensor"


@contextlib.contextmanager
def _cuda_type_names(tensors):
    """While active, CPU fp32 `tensors` answer `t.type()` with the CUDA type name (items 7 and 8); `t.type(dtype)`
    still converts. An instance attribute shadows `Tensor.type` and is deleted on exit."""
    marked = []
    try:
        for t in tensors:
            if t.device.type == "cpu" and t.dtype == torch.float32 and "type" not in vars(t):
                t.type = functools.partial(_type_name, t)
                marked.append(t)
        yield
    finally:
        for t in marked:
            del t.type


def _type_name(tensor, *args, **kwargs):
    return torch.Tensor.type(tensor, *args, **kwargs) if args or kwargs else _CUDA_FLOAT


def _fp32_params_as_cuda(original):
    """DistributedOptimizer._build_model_and_main_param_groups for CPU fp32 parameters (item 7)."""

    def build(cls, gbuf_ranges, param_gbuf_map, opt_group_ranges, config):
        with _cuda_type_names([p for group in opt_group_ranges for p in group["params"]]):
            return original(cls, gbuf_ranges, param_gbuf_map, opt_group_ranges, config)

    return classmethod(build)


def _fp32_grads_as_cuda(original):
    """clip_grad_by_total_norm_fp32 for CPU fp32 gradients (item 8)."""

    def clip(parameters, max_norm, total_norm, use_decoupled_grad=False):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        with _cuda_type_names([p.grad for p in params if p.grad is not None]):
            return original(params, max_norm, total_norm, use_decoupled_grad)

    return clip


_MISSING = object()


def _patch(owner, name, value) -> None:
    """Sets owner.name, saving what the owner itself held (for a class: the raw classmethod, or nothing)."""
    _saved.append((owner, name, vars(owner).get(name, _MISSING)))
    setattr(owner, name, value)


def _define_missing_te_gemm() -> None:
    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    if not hasattr(moe_utils, "te_general_gemm"):
        _patch(moe_utils, "te_general_gemm", None)


def _apply() -> None:
    check_version()
    _define_missing_te_gemm()
    proxy = _CpuTorch()
    for module_name in _TORCH_PROXIED:
        _patch(importlib.import_module(module_name), "torch", proxy)
    dispatcher = importlib.import_module("megatron.core.transformer.moe.token_dispatcher")
    _patch(dispatcher, "maybe_move_tensor_to_cpu", _splits_to_numpy(dispatcher.maybe_move_tensor_to_cpu))
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    _patch(random, "_get_cuda_rng_state", _get_rng_state)
    _patch(random, "_set_cuda_rng_state", _set_rng_state)
    from megatron.core.models.common.language_module.language_module import LanguageModule

    _patch(LanguageModule, "setup_embeddings_and_output_layer",
           _setup_embeddings_on_cpu(LanguageModule.setup_embeddings_and_output_layer))
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    _patch(DistributedOptimizer, "_build_model_and_main_param_groups",
           _fp32_params_as_cuda(DistributedOptimizer._build_model_and_main_param_groups.__func__))
    clip_grads = importlib.import_module("megatron.core.optimizer.clip_grads")
    clip = _fp32_grads_as_cuda(clip_grads.clip_grad_by_total_norm_fp32)
    for module in (clip_grads, importlib.import_module("megatron.core.optimizer.optimizer")):
        _patch(module, "clip_grad_by_total_norm_fp32", clip)


def _restore() -> None:
    while _saved:
        owner, name, value = _saved.pop()
        if value is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, value)


def is_active() -> bool:
    return _depth > 0


@contextlib.contextmanager
def cpu_compat(device: torch.device | str):
    """Applies the patches while active when `device` is the CPU; on GPU only item 5. Re-entrant."""
    global _depth
    if torch.device(device).type != "cpu":
        check_version()
        moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
        if not hasattr(moe_utils, "te_general_gemm"):  # item 5, kept for the process: a GPU has no scope to leave
            moe_utils.te_general_gemm = None
        yield
        return
    with _lock:
        if _depth == 0:
            try:
                _apply()
            except BaseException:
                _restore()
                raise
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _restore()
