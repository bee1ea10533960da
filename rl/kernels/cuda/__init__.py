"""CUDA kernels of rl/kernels (.cu + pybind11 bindings over raw pointers); Python side in `ext.py`."""
