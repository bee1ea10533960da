"""Runs a Hugging Face causal LM over a `PackedBatch` and returns per-token logprobs aligned with target tokens.

Packed batches go in as one row whose position ids restart at every sequence, with the sequence boundaries as
flash-attention's packing kwargs (`cu_seq_lens_q`...): flash attention and `sdpa_varlen` (rl.backends.varlen_attention)
attend within each sequence at its own cost; plain sdpa/eager fall back on the block-diagonal causal mask transformers
derives from the position resets. No token attends across a sequence boundary either way. Padded batches go in as
[S, L] rows with an attention mask.
"""

from __future__ import annotations

from torch import Tensor, nn

from rl.backends.logits import token_logprobs_and_entropy
from rl.backends.varlen_attention import packing_kwargs
from rl.core.packing import PackedBatch


def flat_logits(model: nn.Module, batch: PackedBatch) -> Tensor:
    """[N, V] logits at every flat position of the batch."""
    if batch.padded:
        out = model(input_ids=batch.as_padded(), attention_mask=batch.attention_mask().long(),
                    position_ids=batch.as_padded(batch.position_ids), use_cache=False)
        return out.logits.reshape(batch.num_tokens, -1)
    out = model(input_ids=batch.input_ids[None], position_ids=batch.position_ids[None], use_cache=False,
                **packing_kwargs(batch.cu_seqlens))
    return out.logits[0]


def batch_logprobs(model: nn.Module, batch: PackedBatch, temperature: float, with_entropy: bool,
                   kernels: str = "auto") -> tuple[Tensor, Tensor | None]:
    """(logprobs [N], entropy [N] or None), both aligned with the target token like the batch's loss_mask.
    `kernels` is trainer.kernels: which implementation of the token-logprob op runs (see rl.kernels.ops)."""
    if batch.num_tokens == 0:
        empty = batch.input_ids.new_zeros(0, dtype=next(model.parameters()).dtype)
        return empty.float(), (empty.float() if with_entropy else None)
    logits = flat_logits(model, batch)
    logprobs, entropy = token_logprobs_and_entropy(logits, batch.prediction_targets(), temperature, kernels,
                                                   with_entropy)
    return PackedBatch.align_to_targets(logprobs), (PackedBatch.align_to_targets(entropy) if with_entropy else None)
