"""From hidden states [N, H] and the LM-head weight [V, H] to token logprobs or the loss, a chunk of tokens at a time.

Only two [chunk, V] fp32 buffers (reused by every chunk) exist at once, never all [N, V].
`chunked_token_logprobs` recomputes a chunk's logits in backward; `chunked_policy_loss` knows the per-token loss
gradients as soon as a chunk's logprobs exist, so it computes grad_hidden / grad_weight in the forward and the
backward only scales them (three matmuls in all, like the unchunked eager path). Its autograd wrapper is the one
every implementation shares (`rl.kernels.autograd.ChunkedLoss`); this file gives it the CPU chunk loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.kernels.autograd import ChunkedLoss, ChunkLoss, backprop_chunk
from rl.kernels.reference.policy_terms import loss_terms, metrics_dict, plan_loss
from rl.kernels.sizing import device_of, loss_chunk_tokens

WORKSPACE_ROW_BYTES = 2 * 4
"""Bytes per token and vocabulary entry of this file's chunk: two fp32 [chunk, V] buffers."""


def token_chunk(hidden: Tensor, weight: Tensor, chunk_size: int | None, row_bytes: int) -> int:
    """Tokens per chunk: `chunk_size` when given, else chosen for the hidden states' device (`sizing`), a chunk
    holding `row_bytes` per token."""
    if chunk_size is not None:
        return max(1, int(chunk_size))
    return loss_chunk_tokens(hidden.shape[0], weight.shape[0], row_bytes, device_of(hidden.device))


def check_hidden(hidden: Tensor, weight: Tensor, targets: Tensor) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H], got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [N]={hidden.shape[0]}, got {tuple(targets.shape)}")


class _Workspace:
    """Two [chunk, V] fp32 buffers reused by every chunk: fresh 64 MiB allocations would page-fault each time."""

    def __init__(self, rows: int, vocab: int, device: torch.device):
        self.a = torch.empty(rows, vocab, device=device)
        self.b = torch.empty(rows, vocab, device=device)


def _chunk_softmax(
    hidden_c: Tensor, weight: Tensor, targets_c: Tensor, temperature: float, ws: _Workspace, with_entropy: bool = True
):
    """(log-softmax [C, V], softmax [C, V], logprob [C], entropy [C] or zeros) of one chunk, fp32, in the
    workspace; the entropy costs one more pass over the chunk, so it is skipped when nothing reads it."""
    rows = hidden_c.shape[0]
    logits, logp = ws.a[:rows], ws.b[:rows]
    if hidden_c.dtype == weight.dtype == torch.float32:
        torch.matmul(hidden_c, weight.T, out=logits)
    else:
        logits.copy_(hidden_c @ weight.T)
    if temperature != 1.0:
        logits.div_(temperature)
    torch.ops.aten._log_softmax.out(logits, 1, False, out=logp)
    p = torch.exp(logp, out=logits)
    entropy = -torch.linalg.vecdot(p, logp) if with_entropy else logp.new_zeros(rows)
    return logp, p, logp.gather(1, targets_c.long()[:, None]).squeeze(1), entropy


def _chunk_grad_logits(logp, p, entropy, targets_c, grad_lp, grad_h, temperature) -> Tensor:
    """d loss / d logits of one chunk, in place over `logp` / `p`: g_lp (onehot - p) - g_h p (logp + H), over T.
    `grad_h` None means no entropy gradient (one pass instead of four)."""
    if grad_h is None:
        grad = p.mul_(-grad_lp[:, None])
    else:
        grad = logp.add_(entropy[:, None]).mul_(grad_h[:, None]).add_(grad_lp[:, None]).mul_(p).neg_()
    grad.scatter_add_(1, targets_c.long()[:, None], grad_lp[:, None])
    return grad.div_(temperature) if temperature != 1.0 else grad


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk):
        out_lp = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        out_h = torch.empty_like(out_lp)
        ws = _Workspace(min(chunk, hidden.shape[0]), weight.shape[0], hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            sl = slice(start, start + chunk)
            _, _, out_lp[sl], out_h[sl] = _chunk_softmax(hidden[sl], weight, targets[sl], temperature, ws)
        ctx.save_for_backward(hidden, weight, targets, out_h)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out_lp, out_h

    @staticmethod
    def backward(ctx, grad_lp, grad_h):
        hidden, weight, targets, _ = ctx.saved_tensors
        grad_lp = torch.zeros(hidden.shape[0], device=hidden.device) if grad_lp is None else grad_lp.float()
        grad_h = None if grad_h is None else grad_h.float()
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        ws = _Workspace(min(ctx.chunk, hidden.shape[0]), weight.shape[0], hidden.device)
        for start in range(0, hidden.shape[0], ctx.chunk):
            sl = slice(start, start + ctx.chunk)
            logp, p, _, entropy = _chunk_softmax(hidden[sl], weight, targets[sl], ctx.temperature, ws)
            g_h = None if grad_h is None else grad_h[sl]
            g = _chunk_grad_logits(logp, p, entropy, targets[sl], grad_lp[sl], g_h, ctx.temperature)
            grad_hidden[sl] = backprop_chunk(g, hidden[sl], weight, grad_weight)
        grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
        return grad_hidden, grad_weight, None, None, None


def chunked_token_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> tuple[Tensor, Tensor]:
    """(logprob [N], entropy [N]) fp32 of softmax(hidden @ weight.T / T), differentiable w.r.t. hidden and weight."""
    check_hidden(hidden, weight, targets)
    chunk = token_chunk(hidden, weight, chunk_size, WORKSPACE_ROW_BYTES * weight.shape[0])
    return _ChunkedLogprobs.apply(hidden, weight, targets, float(temperature), chunk)


def reference_chunk_loss(rows: int, vocab: int, device: torch.device, with_entropy: bool) -> ChunkLoss:
    """The CPU chunk loss for `autograd.ChunkedLoss`: in-place torch over one reused workspace."""
    ws = _Workspace(rows, vocab, device)

    def chunk_loss(hidden_c, weight, targets_c, old_c, adv_c, ref_c, plan_c, temperature, need_grad):
        logp, p, lp, entropy = _chunk_softmax(hidden_c, weight, targets_c, temperature, ws, with_entropy)
        old_c = lp if old_c is None else old_c  # on-policy: this forward's own logprobs (ratio exactly 1)
        token_loss, g_lp, g_h, metrics = loss_terms(plan_c, lp, entropy, old_c, adv_c, ref_c)
        grad = None
        if need_grad:
            grad = _chunk_grad_logits(logp, p, entropy, targets_c, g_lp, g_h if plan_c.use_entropy else None,
                                      temperature)
        return token_loss.sum(), metrics.sum(0), grad

    return chunk_loss


def chunked_policy_loss(
    settings: LossSettings,
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    loss_mask: Tensor,
    normalizer: LossNormalizer,
    *,
    ref_logprobs: Tensor | None = None,
    seq_ids: Tensor | None = None,
    num_sequences: int | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool | None = None,
    weight_grad_sink=None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(loss, metrics) of `compute_policy_loss` on the logprobs of softmax(hidden @ weight.T / T), flat [N] tokens,
    without ever holding the [N, V] logits; differentiable w.r.t. hidden and weight. The ``entropy`` metric is
    computed when `with_entropy` (default: when trainer.algorithm.use_entropy_loss needs it). `old_logprobs=None`
    is on-policy, as in `compute_policy_loss`: the old logprobs are these, detached. With `weight_grad_sink`, the
    weight's gradient is not computed in the forward: the backward hands the sink a function that adds it into a
    buffer (`autograd.weight_grad_later`), and returns none for the weight itself."""
    check_hidden(hidden, weight, targets)
    if settings.use_kl_loss and ref_logprobs is None:
        raise ValueError("trainer.algorithm.use_kl_loss is on but no ref_logprobs were given")
    plan = plan_loss(settings, normalizer, loss_mask, seq_ids, num_sequences)
    chunk = token_chunk(hidden, weight, chunk_size, WORKSPACE_ROW_BYTES * weight.shape[0])
    with_entropy = (
        settings.use_entropy_loss if with_entropy is None else bool(with_entropy or settings.use_entropy_loss)
    )
    chunk_loss = reference_chunk_loss(min(chunk, hidden.shape[0]), weight.shape[0], hidden.device, with_entropy)
    loss, totals = ChunkedLoss.apply(
        chunk_loss, hidden, weight, targets, old_logprobs, advantages, ref_logprobs, plan, float(temperature), chunk,
        weight_grad_sink,
    )
    return loss, metrics_dict(plan, totals, ref_logprobs is not None, has_entropy=with_entropy)
