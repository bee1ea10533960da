"""Finds and imports the compiled extension `rl_kernels_cuda.so` (built by //rl/kernels/cuda:rl_kernels_cuda).

Looked up, in order: $RL_KERNELS_CUDA_EXT, next to this file (Bazel runfiles), and bazel-bin of the checkout.
"""

from __future__ import annotations

import functools
import importlib.util
import os

MODULE = "rl_kernels_cuda"
_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))


def candidates() -> list[str]:
    paths = [os.environ.get("RL_KERNELS_CUDA_EXT", "")]
    paths.append(os.path.join(_HERE, MODULE + ".so"))
    paths.append(os.path.join(_REPO, "bazel-bin", "rl", "kernels", "cuda", MODULE + ".so"))
    return [p for p in paths if p and os.path.exists(p)]


@functools.cache
def load():
    """The extension module, or None when it was not built (no CUDA toolkit, or not built yet)."""
    for path in candidates():
        spec = importlib.util.spec_from_file_location(MODULE, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return None


def require():
    module = load()
    if module is None:
        raise RuntimeError(
            "trainer.kernels=cuda needs the extension rl_kernels_cuda.so: build it with "
            "`bazel build //rl/kernels/cuda:rl_kernels_cuda.so` (needs a CUDA toolkit) or set RL_KERNELS_CUDA_EXT"
        )
    return module
