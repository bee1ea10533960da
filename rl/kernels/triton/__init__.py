"""Triton kernels for packing, token logprobs/entropy and the fused GRPO/PPO loss.

On CPU they run only under ``TRITON_INTERPRET=1`` (tests, at tiny sizes); `aot_specs.py` lists the signatures the
Bazel rule compiles ahead of time for sm_80 and sm_90.
"""
