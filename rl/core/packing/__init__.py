"""Sequence packing: the `PackedBatch` layout shared by every backend, its builders and the micro-batch planner."""

from rl.core.packing.batch import TOKEN_FIELDS, PackedBatch
from rl.core.packing.builders import pack_sequences, pad_sequences, unpack, unpack_micro_batches
from rl.core.packing.planner import plan_micro_batches, plan_padded_micro_batches

__all__ = [
    "TOKEN_FIELDS",
    "PackedBatch",
    "pack_sequences",
    "pad_sequences",
    "plan_micro_batches",
    "plan_padded_micro_batches",
    "unpack",
    "unpack_micro_batches",
]
