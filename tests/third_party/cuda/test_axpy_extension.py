"""The CUDA building blocks: nvcc objects for sm_80/sm_90 linked into a pybind11 extension that imports anywhere."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_extension():
    # Next to this file in Bazel's runfiles; $RL_BAZEL_BIN/tests/third_party/cuda/ for builds made without Bazel.
    built = os.path.join(os.environ.get("RL_BAZEL_BIN", ""), "tests", "third_party", "cuda", "axpy_ext.so")
    path = built if os.environ.get("RL_BAZEL_BIN") and os.path.exists(built) else os.path.join(HERE, "axpy_ext.so")
    spec = importlib.util.spec_from_file_location("axpy_ext", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def _cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def test_extension_imports_without_a_gpu():
    module, _ = _load_extension()
    assert callable(module.axpy)


def test_extension_embeds_sm80_and_sm90_cubins_and_ptx():
    _, path = _load_extension()
    elf = subprocess.run([_cuobjdump(), "--list-elf", path], capture_output=True, text=True, check=True).stdout
    ptx = subprocess.run([_cuobjdump(), "--list-ptx", path], capture_output=True, text=True, check=True).stdout
    assert "sm_80" in elf and "sm_90" in elf, elf
    assert "sm_90" in ptx, ptx


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error path of a machine without a GPU")
def test_call_without_gpu_raises_a_clear_error():
    module, _ = _load_extension()
    with pytest.raises(RuntimeError, match="CUDA"):
        module.axpy(2.0, 0, 0, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_axpy_matches_torch_on_gpu():
    module, _ = _load_extension()
    x = torch.randn(1000, device="cuda")
    y = torch.randn(1000, device="cuda")
    expected = y + 3.0 * x
    module.axpy(3.0, x.data_ptr(), y.data_ptr(), x.numel(), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, expected)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
