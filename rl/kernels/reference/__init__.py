"""Torch reference ops: the oracle of every kernel in tests, and the CPU path of the dispatch."""

from rl.kernels.reference.chunked import chunked_policy_loss, chunked_token_logprobs
from rl.kernels.reference.fused_loss import fused_policy_loss
from rl.kernels.reference.logprobs import token_logprobs_entropy
from rl.kernels.reference.packing import cu_seqlens_from_lengths, pack, position_ids, unpack
from rl.kernels.reference.policy_terms import LossPlan, plan_loss

__all__ = [
    "LossPlan",
    "chunked_policy_loss",
    "chunked_token_logprobs",
    "cu_seqlens_from_lengths",
    "fused_policy_loss",
    "pack",
    "plan_loss",
    "position_ids",
    "token_logprobs_entropy",
    "unpack",
]
