"""Kernels for sequence packing and the GRPO/PPO loss: torch references, Triton and CUDA kernels, one dispatch.

`rl.kernels.ops` is the entry point; `reference` holds the torch oracles that are also the CPU path.
"""
