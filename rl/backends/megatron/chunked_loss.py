"""The GRPO/PPO loss from hidden states and a vocab-parallel output layer, a chunk of tokens at a time.

Megatron splits the output layer's weight [V_pad, H] by vocabulary rows over tensor parallelism (TP). Per chunk of
tokens each rank computes its local logits (hidden @ local shard), then three all-reduces over the TP group give the
softmax statistics of the whole vocabulary: MAX of the row maxima, then one SUM of (sum exp, target logit,
sum p * z). Every rank then holds the same logprob and entropy per token, evaluates the same closed-form loss
(rl/kernels/reference/policy_terms.py) and writes d loss / d local logits, which two matmuls turn into the local
weight's gradient and this rank's partial gradient of the hidden states. The [tokens, vocabulary] logits never
exist; the numbers are those of `vocab_parallel_logprobs` + `compute_policy_loss`.

The partial hidden gradient follows ColumnParallelLinear's convention: pass the hidden states through
`copy_to_tensor_model_parallel_region` (or, with sequence parallelism, `gather_from_sequence_parallel_region`), whose
backward sums the partials over TP. `copy_to_group` is the same op for an explicit group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.kernels.autograd import backprop_chunk, slice_plan
from rl.kernels.reference.chunked import token_chunk
from rl.kernels.reference.policy_terms import LossPlan, loss_terms, metrics_dict, plan_loss


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, group):
        ctx.group = group
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def copy_to_group(hidden: Tensor, group) -> Tensor:
    """Identity forward, SUM all-reduce of the gradient over `group` backward (megatron's copy-to-TP-region)."""
    return _CopyToGroup.apply(hidden, group)


def _chunk_stats(hidden_c, weight, targets_c, vocab_start, vocab_size, temperature, group):
    """(z [C, V_local] fp32 logits / T with padding at -inf, lse [C], logprob [C], entropy [C]) of the whole
    vocabulary, from this rank's shard and two all-reduces."""
    local = weight.shape[0]
    z = (hidden_c @ weight.T).float()
    if temperature != 1.0:
        z = z / temperature
    padding = torch.arange(vocab_start, vocab_start + local, device=z.device) >= vocab_size
    z = z.masked_fill(padding, float("-inf"))
    peak = z.amax(dim=-1)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    e = torch.exp(z - peak[:, None])
    index = targets_c.long() - vocab_start
    mine = (index >= 0) & (index < local)
    picked = z.gather(1, index.clamp(0, local - 1)[:, None]).squeeze(1)
    sums = torch.stack([e.sum(-1), torch.where(mine, picked, torch.zeros_like(picked)),
                        (e * z.masked_fill(padding, 0.0)).sum(-1)])
    dist.all_reduce(sums, group=group)
    total, target, weighted = sums.unbind(0)
    lse = peak + torch.log(total)
    return z, lse, target - lse, lse - weighted / total


def _chunk_grad(z, lse, entropy, targets_c, vocab_start, g_lp, g_h, temperature) -> Tensor:
    """d loss / d local logits: g_lp (onehot - p) - g_h p (log p + H), over T; padding columns get 0."""
    logp = z - lse[:, None]
    p = torch.exp(logp)
    grad = -p * g_lp[:, None]
    if g_h is not None:
        grad = grad - torch.where(p > 0, p * (logp + entropy[:, None]), torch.zeros_like(p)) * g_h[:, None]
    index = targets_c.long() - vocab_start
    mine = (index >= 0) & (index < z.shape[1])
    grad.scatter_add_(1, index.clamp(0, z.shape[1] - 1)[:, None], torch.where(mine, g_lp, 0.0)[:, None])
    return grad / temperature if temperature != 1.0 else grad


class _VocabParallelChunkedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, old, adv, ref, plan: LossPlan, temperature, chunk, vocab_start,
                vocab_size, group):
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        loss, totals = torch.zeros((), device=hidden.device), torch.zeros(6, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            sl = slice(start, start + chunk)
            z, lse, lp, entropy = _chunk_stats(hidden[sl], weight, targets[sl], vocab_start, vocab_size,
                                               temperature, group)
            token_loss, g_lp, g_h, metrics = loss_terms(slice_plan(plan, sl), lp, entropy,
                                                        lp if old is None else old[sl], adv[sl],
                                                        None if ref is None else ref[sl])
            loss += token_loss.sum()
            totals += metrics.sum(0)
            grad = _chunk_grad(z, lse, entropy, targets[sl], vocab_start, g_lp, g_h if plan.use_entropy else None,
                               temperature)
            grad_hidden[sl] = backprop_chunk(grad, hidden[sl], weight, grad_weight)
        ctx.grads = (grad_hidden, grad_weight.to(weight.dtype))
        ctx.mark_non_differentiable(totals)
        return loss, totals

    @staticmethod
    def backward(ctx, grad_loss, _grad_totals):
        grad_hidden, grad_weight = ctx.grads
        del ctx.grads
        return (grad_hidden.mul_(grad_loss.to(grad_hidden.dtype)), grad_weight.mul_(grad_loss.to(grad_weight.dtype)),
                *([None] * 10))


def vocab_parallel_chunked_loss(
    settings: LossSettings,
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    loss_mask: Tensor,
    normalizer: LossNormalizer,
    *,
    vocab_start: int,
    vocab_size: int,
    group=None,
    ref_logprobs: Tensor | None = None,
    seq_ids: Tensor | None = None,
    num_sequences: int | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(loss, metrics) of `compute_policy_loss` over flat [T] tokens, from hidden [T, H] (the same on every TP
    rank) and this rank's vocabulary rows `weight` [V_local, H] (global ids vocab_start..; rows at or past
    `vocab_size` are padding). Collective over `group` (the TP group; None: the default group): every rank calls it
    with the same tokens. grad_hidden is this rank's partial (see the module docstring); grad_weight its shard's.
    `old_logprobs=None` is on-policy (the ratio is exactly 1); the ``entropy`` metric is reported when the loss
    uses it."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be [T, H] and weight [V_local, H], got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if settings.use_kl_loss and ref_logprobs is None:
        raise ValueError("trainer.algorithm.use_kl_loss is on but no ref_logprobs were given")
    plan = plan_loss(settings, normalizer, loss_mask, seq_ids, num_sequences)
    # a chunk holds up to six fp32 [chunk, V_local] tensors at once (logits, exponentials, the gradient's terms)
    chunk = token_chunk(hidden, weight, chunk_size, 6 * 4 * weight.shape[0])
    loss, totals = _VocabParallelChunkedLoss.apply(
        hidden, weight, targets, old_logprobs, advantages, ref_logprobs, plan, float(temperature), chunk,
        int(vocab_start), int(vocab_size), group,
    )
    return loss, metrics_dict(plan, totals, ref_logprobs is not None, has_entropy=settings.use_entropy_loss)
