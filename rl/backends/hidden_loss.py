"""`trainer.policy.use_fused_kernels` for Hugging Face models: the policy loss and the token logprobs from the last
hidden states and the LM-head weight, a chunk of tokens at a time, so the [tokens, vocabulary] logits never exist.

The model's own forward runs (its LM head replaced for the call, `hf_forward.head_call`), so FSDP, FSDP2 and
ZeRO-3 gather the head's weight as they do for the logits path and route its gradient back to the shards; tied
input/output embeddings get both gradients. The loss is `rl.kernels.ops.chunked_policy_loss`, the same numbers as
`compute_policy_loss` over `batch_logprobs`.
"""

from __future__ import annotations

from torch import Tensor, nn

from rl.backends.hf_forward import head_call
from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.packing import PackedBatch
from rl.kernels import ops


def _take(values: Tensor | None, at: Tensor) -> Tensor | None:
    return None if values is None else values[at]


def hidden_policy_loss(model: nn.Module, batch: PackedBatch, settings: LossSettings, normalizer: LossNormalizer,
                       temperature: float, kernels: str = "auto", chunk_size: int | None = None,
                       defer_head_grad: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
    """(loss, metrics) as `compute_policy_loss` gives them for `batch_logprobs(model, batch, ...)`, entropy passed
    when the loss uses it; the loss is the model's output, so the wrappers' backward hooks see it.
    `defer_head_grad`: tied embeddings get the head's weight gradient at the end of backward (`tied_grad`)."""
    metrics: dict[str, Tensor] = {}
    seq_ids = batch.token_seq_ids()

    def head(hidden: Tensor, weight: Tensor, at: Tensor, sink) -> Tensor:
        loss, values = ops.chunked_policy_loss(
            settings, hidden, weight, batch.input_ids[at], _take(batch.old_logprobs, at), batch.advantages[at],
            batch.loss_mask[at], normalizer, kernels=kernels, ref_logprobs=_take(batch.ref_logprobs, at),
            seq_ids=seq_ids[at], num_sequences=batch.num_sequences, temperature=temperature, chunk_size=chunk_size,
            weight_grad_sink=sink,
        )
        metrics.update(values)
        return loss

    return head_call(model, batch, head, defer_head_grad), metrics


def hidden_logprobs(model: nn.Module, batch: PackedBatch, temperature: float, with_entropy: bool,
                    chunk_size: int | None = None) -> tuple[Tensor, Tensor | None]:
    """`batch_logprobs` (same layout: [N], 0 off the scored positions) from hidden states, chunk by chunk."""
    found: dict[str, Tensor] = {}

    def head(hidden: Tensor, weight: Tensor, at: Tensor, _sink) -> Tensor:
        logprobs, entropy = ops.chunked_token_logprobs(hidden, weight, batch.input_ids[at], temperature, chunk_size)
        found.update(at=at, entropy=entropy)
        return logprobs

    logprobs = head_call(model, batch, head)

    def spread(values: Tensor) -> Tensor:
        return values.new_zeros(batch.num_tokens).index_put((found["at"],), values)

    return spread(logprobs), (spread(found["entropy"]) if with_entropy else None)
