"""Triton kernels: token logprob / entropy / logsumexp per row (online over vocabulary blocks) and its backward.

The row pass and the gradient block are device functions reused by the fused loss kernel.
"""

import triton
import triton.language as tl


@triton.jit
def row_stats(row_ptr, target, vocab, inv_temp, BLOCK_V: tl.constexpr):
    """(logprob of target, entropy, lse) of softmax(row * inv_temp), one pass with a running max."""
    m = float("-inf")
    s = 0.0
    t = 0.0
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        z = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32) * inv_temp
        m_new = tl.maximum(m, tl.max(z, axis=0))
        scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
        e = tl.where(z == float("-inf"), 0.0, tl.exp(z - m_new))
        s = s * scale + tl.sum(e, axis=0)
        t = t * scale + tl.sum(e * tl.where(e > 0, z, 0.0), axis=0)
        m = m_new
    lse = m + tl.log(s)
    target_z = tl.load(row_ptr + target).to(tl.float32) * inv_temp
    return target_z - lse, lse - t / s, lse


@triton.jit
def grad_block(row_ptr, grad_ptr, cols, target, vocab, inv_temp, lse, entropy, g_lp, g_h):
    """Write d loss / d logits for columns `cols` of one row: (g_lp (onehot - p) - g_h p (logp + H)) / T."""
    ok = cols < vocab
    z = tl.load(row_ptr + cols, mask=ok, other=float("-inf")).to(tl.float32) * inv_temp
    logp = z - lse
    p = tl.exp(logp)
    g = -p * g_lp - p * tl.where(p > 0, logp + entropy, 0.0) * g_h
    g = g + tl.where(cols == target, g_lp, 0.0)
    tl.store(grad_ptr + cols, (g * inv_temp).to(grad_ptr.dtype.element_ty), mask=ok)


@triton.jit
def logprobs_fwd_kernel(
    logits_ptr, targets_ptr, lp_ptr, ent_ptr, lse_ptr, vocab, stride, inv_temp, BLOCK_V: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    target = tl.load(targets_ptr + row)
    lp, ent, lse = row_stats(logits_ptr + row * stride, target, vocab, inv_temp, BLOCK_V)
    tl.store(lp_ptr + row, lp)
    tl.store(ent_ptr + row, ent)
    tl.store(lse_ptr + row, lse)


@triton.jit
def logprobs_bwd_kernel(
    logits_ptr,
    targets_ptr,
    lse_ptr,
    ent_ptr,
    glp_ptr,
    gent_ptr,
    grad_ptr,
    vocab,
    stride,
    inv_temp,
    BLOCK_V: tl.constexpr,
):
    """Program (row, j) writes vocabulary block j of row's gradient."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    grad_block(
        logits_ptr + row * stride,
        grad_ptr + row * stride,
        cols,
        tl.load(targets_ptr + row),
        vocab,
        inv_temp,
        tl.load(lse_ptr + row),
        tl.load(ent_ptr + row),
        tl.load(glp_ptr + row),
        tl.load(gent_ptr + row),
    )
