"""Triton kernel of the fused GRPO/PPO loss: per row, one online pass for logprob/entropy, the per-token loss
and its derivatives, then a second pass writing the row's d loss / d logits (the gradient comes out of the
forward; the autograd backward only scales it). ON_POLICY: the old logprob is the row's own, detached (ratio
exactly 1, and no separate logprob pass over the logits)."""

import triton
import triton.language as tl

from rl.kernels.triton.logprobs_kernels import grad_block, row_stats
from rl.kernels.triton.loss_math import kl_token, policy_token


@triton.jit
def fused_loss_kernel(
    logits_ptr,
    targets_ptr,
    old_ptr,
    adv_ptr,
    ref_ptr,
    weight_ptr,
    mweight_ptr,
    tweight_ptr,
    token_loss_ptr,
    metrics_ptr,
    grad_ptr,
    vocab,
    stride,
    inv_temp,
    eps_low,
    eps_high,
    clip_c,
    kl_coef,
    ent_coef,
    POLICY: tl.constexpr,
    KL: tl.constexpr,
    HAS_REF: tl.constexpr,
    USE_KL: tl.constexpr,
    USE_ENT: tl.constexpr,
    BLOCK_V: tl.constexpr,
    ON_POLICY: tl.constexpr = False,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride
    target = tl.load(targets_ptr + row)
    lp, ent, lse = row_stats(row_ptr, target, vocab, inv_temp, BLOCK_V)
    old = lp if ON_POLICY else tl.load(old_ptr + row).to(tl.float32)
    pg, d_lp, clip, lower = policy_token(
        lp, old, tl.load(adv_ptr + row).to(tl.float32), eps_low, eps_high, clip_c, POLICY
    )
    total = pg
    kl = lp * 0.0
    if HAS_REF:
        kl, d_kl = kl_token(lp, tl.load(ref_ptr + row).to(tl.float32), KL)
        if USE_KL:
            total = total + kl_coef * kl
            d_lp = d_lp + kl_coef * d_kl
    d_h = lp * 0.0
    if USE_ENT:
        total = total - ent_coef * ent
        d_h = d_h - ent_coef
    w = tl.load(weight_ptr + row)
    mw = tl.load(mweight_ptr + row)
    tw = tl.load(tweight_ptr + row)
    on = w != 0
    tl.store(token_loss_ptr + row, tl.where(on, w * total, 0.0))
    out = metrics_ptr + row * 6
    tl.store(out + 0, tl.where(on, mw * pg, 0.0))
    tl.store(out + 1, tl.where(on, mw * kl, 0.0))
    tl.store(out + 2, tl.where(on, mw * ent, 0.0))
    tl.store(out + 3, tw * clip)
    tl.store(out + 4, tw * lower)
    tl.store(out + 5, tl.where(on, tw * (old - lp), 0.0))
    g_lp = tl.where(on, w * d_lp, 0.0)
    g_h = tl.where(on, w * d_h, 0.0)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        grad_block(row_ptr, grad_ptr + row * stride, cols, target, vocab, inv_temp, lse, ent, g_lp, g_h)
