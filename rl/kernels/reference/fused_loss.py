"""The GRPO/PPO loss fused with the token logprobs: logits in, loss (and its gradient) out.

Forward: blockwise logprob/entropy (`logprobs.py`), then the closed-form per-token loss (`policy_terms.py`).
Backward: one blockwise pass over the vocabulary with the per-token grads the forward already computed. Gives the
numbers of `rl.core.algorithms.compute_policy_loss` with the same `LossSettings` and `LossNormalizer`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.kernels.reference.logprobs import logprobs_backward, logprobs_forward
from rl.kernels.reference.policy_terms import loss_terms, metrics_dict, plan_loss


class _FusedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, old, adv, ref, plan, temperature, block_size):
        logprob, entropy, lse = logprobs_forward(logits, targets, temperature, block_size)
        token_loss, grad_lp, grad_h, metrics = loss_terms(plan, logprob, entropy, old, adv, ref)
        ctx.save_for_backward(logits, targets, lse, entropy, grad_lp, grad_h)
        ctx.temperature, ctx.block_size = temperature, block_size
        totals = metrics.sum(0)
        ctx.mark_non_differentiable(totals)
        return token_loss.sum(), totals

    @staticmethod
    def backward(ctx, grad_loss, _grad_metrics):
        logits, targets, lse, entropy, grad_lp, grad_h = ctx.saved_tensors
        grad = logprobs_backward(
            logits, targets, ctx.temperature, lse, entropy, grad_lp * grad_loss, grad_h * grad_loss, ctx.block_size
        )
        return grad, None, None, None, None, None, None, None


def fused_policy_loss(
    settings: LossSettings,
    logits: Tensor,
    targets: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    normalizer: LossNormalizer,
    *,
    ref_logprobs: Tensor | None = None,
    seq_ids: Tensor | None = None,
    num_sequences: int | None = None,
    temperature: float = 1.0,
    block_size: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(loss, metrics) of `compute_policy_loss` on logprobs = log softmax(logits / T)[targets] over flat [N] tokens.

    `logits` [N, V] and `targets` [N] are aligned with the other token tensors (row t scores target t). Metrics
    also include ``entropy`` (computed anyway).
    """
    plan = plan_loss(settings, normalizer, loss_mask, seq_ids, num_sequences)
    if settings.use_kl_loss and ref_logprobs is None:
        raise ValueError("trainer.algorithm.use_kl_loss is on but no ref_logprobs were given")
    loss, totals = _FusedLoss.apply(
        logits, targets, old_logprobs, advantages, ref_logprobs, plan, float(temperature), block_size
    )
    return loss, metrics_dict(plan, totals, ref_logprobs is not None)
