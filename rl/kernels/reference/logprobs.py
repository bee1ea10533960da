"""Token logprobs and entropy from logits without a full fp32 log-softmax.

The forward walks the vocabulary in blocks keeping a running max ``m``, ``s = sum exp(z - m)`` and
``t = sum exp(z - m) * z`` (z = logits / temperature), so only one fp32 block is alive at a time:
``lse = m + log s``, ``logprob = z[target] - lse``, ``entropy = lse - t / s``. The backward recomputes the
softmax block by block from the saved ``lse``:

    d logprob / d z_j = onehot_j - p_j        d entropy / d z_j = -p_j (log p_j + entropy)

When nobody asks for the entropy (the logprob passes, a loss without the entropy bonus) neither ``t`` nor the entropy
gradient is computed: each block is then a native `logsumexp` forward and an in-place ``-p * g`` backward, about a
third of the elementwise passes over the [N, V] logits.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Elements of one fp32 work block (64 MiB); the vocabulary block shrinks as the token count grows.
BLOCK_ELEMENTS = 1 << 24


def vocab_block(num_tokens: int, vocab: int, block_size: int | None = None) -> int:
    if block_size is not None:
        return max(1, int(block_size))
    return max(256, min(vocab, BLOCK_ELEMENTS // max(num_tokens, 1)))


def _rescale(m_old: Tensor, m_new: Tensor) -> Tensor:
    # exp(m_old - m_new), defined as 0 while the running max is still -inf
    return torch.where(torch.isfinite(m_old), torch.exp(m_old - m_new), torch.zeros_like(m_new))


def _xlogx_safe(weights: Tensor, values: Tensor) -> Tensor:
    return torch.where(weights > 0, weights * values, torch.zeros_like(values))


def check_logits(logits: Tensor, targets: Tensor) -> None:
    if logits.dim() != 2 or targets.shape != logits.shape[:1] or logits.shape[1] == 0:
        raise ValueError(f"logits must be [N, V] and targets [N], got {tuple(logits.shape)} and {tuple(targets.shape)}")


def _scaled_block(logits: Tensor, start: int, step: int, temperature: float) -> Tensor:
    """fp32 z = logits[:, block] / temperature; may be a view of `logits` (fp32, temperature 1): never write to it."""
    z = logits[:, start : start + step].float()
    return z if temperature == 1.0 else z / temperature


def _target_logits(logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
    return logits.gather(1, targets.long()[:, None]).squeeze(1).float() / temperature


def logprobs_forward(logits: Tensor, targets: Tensor, temperature: float = 1.0, block_size: int | None = None,
                     with_entropy: bool = True):
    """(logprob [N], entropy [N] or None, lse [N]) in fp32, one vocabulary block at a time."""
    check_logits(logits, targets)
    n, v = logits.shape
    step = vocab_block(n, v, block_size)
    if not with_entropy:
        lse = torch.full((n,), float("-inf"), device=logits.device)
        for start in range(0, v, step):
            lse = torch.logaddexp(lse, torch.logsumexp(_scaled_block(logits, start, step, temperature), dim=-1))
        return _target_logits(logits, targets, temperature) - lse, None, lse
    m = torch.full((n,), float("-inf"), device=logits.device)
    s = torch.zeros(n, device=logits.device)
    t = torch.zeros(n, device=logits.device)
    for start in range(0, v, step):
        z = _scaled_block(logits, start, step, temperature)
        m_new = torch.maximum(m, z.amax(-1))
        scale = _rescale(m, m_new)
        # a row whose max is still -inf (all masked so far) shifts by 0: its exps are 0, not NaN
        e = torch.exp(z - torch.where(torch.isfinite(m_new), m_new, 0.0)[:, None])
        s = s * scale + e.sum(-1)
        t = t * scale + _xlogx_safe(e, z).sum(-1)
        m = m_new
    lse = m + torch.log(s)
    entropy = lse - t / s
    return _target_logits(logits, targets, temperature) - lse, entropy, lse


def logprobs_backward(logits, targets, temperature, lse, entropy, grad_logprob, grad_entropy, block_size=None):
    """d(loss)/d(logits) [N, V] in the logits' dtype, from per-token grads of logprob and entropy (grad_entropy
    None: the entropy took no part in the loss, and its term is skipped)."""
    n, v = logits.shape
    grad = torch.empty_like(logits)
    g_lp = grad_logprob.float()[:, None]
    step = vocab_block(n, v, block_size)
    cols = targets.long()[:, None]
    for start in range(0, v, step):
        z = _scaled_block(logits, start, step, temperature)
        logp = z - lse[:, None]
        if grad_entropy is None:
            g = logp.exp_().mul_(-g_lp)  # -p * g_lp, in the block's one fresh buffer
        else:
            p = torch.exp(logp)
            g = -p * g_lp - _xlogx_safe(p, logp + entropy[:, None]) * grad_entropy.float()[:, None]
        hit = (cols >= start) & (cols < start + z.shape[1])
        local = (cols - start).clamp(0, z.shape[1] - 1)
        g.scatter_add_(1, local, torch.where(hit, g_lp, torch.zeros_like(g_lp)))
        grad[:, start : start + step] = g if temperature == 1.0 else g.div_(temperature)
    return grad


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, block_size, with_entropy):
        logprob, entropy, lse = logprobs_forward(logits, targets, temperature, block_size, with_entropy)
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.temperature, ctx.block_size = temperature, block_size
        ctx.set_materialize_grads(False)  # an unused entropy output comes back as None: its backward term is skipped
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        logits, targets, lse, entropy = ctx.saved_tensors
        grad_logprob = torch.zeros_like(lse) if grad_logprob is None else grad_logprob
        grad = logprobs_backward(
            logits, targets, ctx.temperature, lse, entropy, grad_logprob, grad_entropy, ctx.block_size
        )
        return grad, None, None, None, None


def token_logprobs_entropy(logits: Tensor, targets: Tensor, temperature: float = 1.0, block_size: int | None = None,
                           with_entropy: bool = True):
    """(logprob [N], entropy [N]) fp32 of softmax(logits / temperature), differentiable w.r.t. logits; entropy is
    None with `with_entropy=False`, which skips its work in both passes."""
    return _TokenLogprobs.apply(logits, targets, float(temperature), block_size, with_entropy)
