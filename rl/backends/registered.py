"""Imports each strategy module once so that its `BACKENDS` entry exists."""

from rl.backends import deepspeed, fsdp, fsdp2  # noqa: F401
from rl.backends.megatron import backend as megatron  # noqa: F401
