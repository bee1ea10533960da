"""//rl/kernels/cuda:rl_kernels_cuda.so: sm_80/sm_90 cubins and compute_90 PTX of every kernel, imports without a
GPU, and says clearly what to do when called on a machine without one."""

import importlib.util
import os

import pytest
import torch

from tests.rl.kernels.artifacts import cuobjdump, find

KERNELS = (
    "cu_seqlens_kernel",
    "position_ids_kernel",
    "pack_kernel",
    "unpack_kernel",
    "forward_kernel",
    "backward_kernel",
    "fused_loss_kernel",
)


def _path() -> str:
    return find(os.path.join("rl", "kernels", "cuda", "rl_kernels_cuda.so"))


def _load():
    spec = importlib.util.spec_from_file_location("rl_kernels_cuda", _path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_imports_without_a_gpu():
    module = _load()
    for name in ("cu_seqlens", "position_ids", "pack", "unpack", "logprobs_forward", "logprobs_backward", "fused_loss"):
        assert callable(getattr(module, name))


def test_embeds_sm80_sm90_cubins_ptx_and_every_kernel():
    path = _path()
    elf = cuobjdump("--list-elf", path)
    assert "sm_80" in elf and "sm_90" in elf, elf
    assert "sm_90" in cuobjdump("--list-ptx", path)
    symbols = cuobjdump("-symbols", path)
    entries = [line.split()[-1] for line in symbols.splitlines() if "STO_ENTRY" in line]
    for kernel in KERNELS:
        assert any(kernel in entry for entry in entries), kernel


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error path of a machine without a GPU")
def test_call_without_gpu_raises_a_clear_error():
    with pytest.raises(RuntimeError, match=r"needs a CUDA device.*trainer\.kernels"):
        _load().logprobs_forward(0, 0, 0, 0, 0, 0, 1, 8, 8, 1.0, 0)
