"""`trainer.policy.use_fused_kernels` under megatron: the last stage's output layer hands its input (the final
hidden states) to the loss instead of computing vocab-parallel logits, and the loss goes from those hidden states and
the rank's vocabulary shard of the output weight to the GRPO/PPO loss a chunk of tokens at a time
(`chunked_loss.vocab_parallel_chunked_loss`), so the [tokens, vocabulary / TP] logits never exist.

The hidden states enter the TP region as the output layer would take them (all-gathered over the sequence with
sequence parallelism, copied otherwise), so their gradient is summed over TP ranks on the way back; the weight's
gradient reaches megatron's grad buffers through the parameter, tied embeddings included.
"""

from __future__ import annotations

import contextlib

from torch import Tensor

from rl.backends.megatron.chunked_loss import vocab_parallel_chunked_loss
from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.packing import PackedBatch


@contextlib.contextmanager
def output_layer_yields_hidden(model, seen: dict):
    """Within the scope the model's output layer returns its (TP-region) input; `seen["weight"]` is the weight it
    would have used (its own, or the shared embedding when tied). No-op on stages without an output layer."""
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        gather_from_sequence_parallel_region,
    )

    layer = getattr(model, "output_layer", None)
    if layer is None:
        yield
        return

    def forward(hidden, weight=None, runtime_gather_output=None):
        seen["weight"] = layer.weight if weight is None else weight
        if layer.sequence_parallel:
            return gather_from_sequence_parallel_region(hidden), None
        return copy_to_tensor_model_parallel_region(hidden), None

    layer.forward = forward
    try:
        yield
    finally:
        del layer.forward  # back to the class's forward


def fused_policy_loss(hidden: Tensor, weight: Tensor, batch: PackedBatch, settings: LossSettings,
                      normalizer: LossNormalizer, *, vocab_start: int, vocab_size: int, group, temperature: float,
                      chunk_size: int | None) -> tuple[Tensor, dict[str, Tensor]]:
    """(loss, metrics) of one micro-batch from its hidden states [N, H] (one per token): the positions that predict
    a loss token go through the vocab-parallel chunked loss; the numbers are those of the logits path."""
    at = batch.loss_mask.roll(-1, dims=0).nonzero().squeeze(-1)  # position t predicts token t + 1
    if at.numel() == 0:
        return hidden.sum() * 0.0, {}
    targets = at + 1

    def take(values: Tensor | None) -> Tensor | None:
        return None if values is None else values[targets]

    return vocab_parallel_chunked_loss(
        settings, hidden[at], weight, batch.input_ids[targets], take(batch.old_logprobs), batch.advantages[targets],
        batch.loss_mask[targets], normalizer, vocab_start=vocab_start, vocab_size=vocab_size, group=group,
        ref_logprobs=take(batch.ref_logprobs), seq_ids=batch.token_seq_ids()[targets],
        num_sequences=batch.num_sequences, temperature=temperature, chunk_size=chunk_size)

