"""The autograd wrappers shared by every kernel implementation (Triton, CUDA), parametrised by its kernels.

An implementation supplies `LossKernels`: raw forward/backward functions over [N, V] logits that know nothing of
autograd. The Functions here turn them into differentiable ops, so the Triton and CUDA paths cannot drift apart in
how gradients are saved, scaled or returned:

- `TokenLogprobs`: (logprob, entropy) from logits; the backward recomputes the softmax from the saved lse.
- `FusedLoss`: the GRPO/PPO loss from logits; the kernel writes d loss / d logits in the forward, the backward
  only scales it by the incoming gradient.
- `ChunkedLoss`: the same loss from hidden states and the LM-head weight a chunk of tokens at a time; per chunk
  the logits are one matmul, then the implementation's chunk loss (a kernel on GPU, in-place torch on CPU) gives
  the chunk's d loss / d logits, which two matmuls turn into grad_hidden / grad_weight. The [N, V] logits never
  exist; the backward scales the gradients accumulated in the forward.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # the reference package imports this module
    from rl.kernels.reference.policy_terms import LossPlan


@dataclass(frozen=True)
class LossKernels:
    """One implementation's kernels (no autograd inside).

    `logprobs_forward(logits, targets, temperature) -> (logprob [N], entropy [N], lse [N])`, fp32.
    `logprobs_backward(logits, targets, temperature, lse, entropy, grad_lp, grad_ent) -> grad logits [N, V]`.
    `loss_forward(logits, targets, old | None, adv, ref | None, plan, temperature)
        -> (token_loss [N], metrics [N, 6], grad logits [N, V])`, see reference.policy_terms.loss_terms; old None:
        on-policy, the old logprobs are the kernel's own, detached (ratio exactly 1).
    """

    name: str
    logprobs_forward: Callable
    logprobs_backward: Callable
    loss_forward: Callable


class TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernels: LossKernels, logits, targets, temperature):
        lp, ent, lse = kernels.logprobs_forward(logits, targets, temperature)
        ctx.save_for_backward(logits, targets, lse, ent)
        ctx.kernels, ctx.temperature = kernels, temperature
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        logits, targets, lse, ent = ctx.saved_tensors
        grad_lp = torch.zeros_like(lse) if grad_lp is None else grad_lp.float().contiguous()
        grad_ent = torch.zeros_like(lse) if grad_ent is None else grad_ent.float().contiguous()
        grad = ctx.kernels.logprobs_backward(logits, targets, ctx.temperature, lse, ent, grad_lp, grad_ent)
        return None, grad, None, None


class FusedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernels: LossKernels, logits, targets, old, adv, ref, plan: LossPlan, temperature):
        token_loss, metrics, grad = kernels.loss_forward(logits, targets, old, adv, ref, plan, temperature)
        ctx.save_for_backward(grad)
        totals = metrics.sum(0)
        ctx.mark_non_differentiable(totals)
        return token_loss.sum(), totals

    @staticmethod
    def backward(ctx, grad_loss, _grad_totals):
        (grad,) = ctx.saved_tensors
        return None, grad * grad_loss.to(grad.dtype), None, None, None, None, None, None


# (hidden_c, weight, targets_c, old_c | None, adv_c, ref_c | None, plan_c, temperature, need_grad)
#   -> (loss sum [], metric sums [6], d loss / d logits [C, V] or None without need_grad); old None: on-policy
ChunkLoss = Callable[..., tuple[Tensor, Tensor, Tensor]]


def slice_plan(plan: LossPlan, sl: slice) -> LossPlan:
    return dataclasses.replace(
        plan, weight=plan.weight[sl], metric_weight=plan.metric_weight[sl], token_weight=plan.token_weight[sl]
    )


def backprop_chunk(grad_logits: Tensor, hidden_c: Tensor, weight: Tensor, grad_weight: Tensor | None) -> Tensor:
    """grad_hidden of a chunk, accumulating its grad_weight (fp32) in place."""
    grad_logits = grad_logits.to(weight.dtype)
    if grad_weight is not None:
        add_product(grad_weight, grad_logits.T, hidden_c.to(weight.dtype))
    return grad_logits @ weight


def add_product(total: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """total += a @ b, in place, `total` fp32. With bf16 or fp16 factors on a GPU the matmul runs in their dtype on
    the tensor cores with an fp32 result (cuBLAS's output-dtype addmm): upcasting them instead would run an fp32
    matmul, an order of magnitude slower, over the whole [V, H] weight per chunk. Where this torch lacks that addmm,
    the product is rounded once to the factors' dtype and added in fp32. Off the GPU the factors are upcast (exact)
    and multiplied in fp32."""
    if a.dtype != total.dtype and total.is_cuda:
        if fp32_out_addmm(total.device):
            return torch.addmm(total, a, b, out_dtype=total.dtype, out=total)
        return total.add_(a @ b)
    return total.addmm_(a.to(total.dtype), b.to(total.dtype))


@functools.cache
def fp32_out_addmm(device: torch.device) -> bool:
    """Whether this torch's addmm on `device` adds bf16 factors' fp32 product into its own fp32 input (tried once,
    on a 2 x 2 product)."""
    if not hasattr(torch.ops.aten.addmm, "dtype_out"):
        return False
    try:
        total, ones = torch.ones(2, 2, device=device), torch.ones(2, 2, dtype=torch.bfloat16, device=device)
        torch.addmm(total, ones, ones, out_dtype=torch.float32, out=total)
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return bool((total == 3).all())


class ChunkedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, chunk_loss: ChunkLoss, hidden, weight, targets, old, adv, ref, plan: LossPlan, temperature,
                chunk, weight_grad_sink=None):
        want_hidden, want_weight = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        defer = want_weight and weight_grad_sink is not None
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight and not defer else None
        loss = torch.zeros((), device=hidden.device)
        totals = torch.zeros(6, device=hidden.device)
        part = lambda t, sl: None if t is None else t[sl]  # noqa: E731
        h, w = hidden.detach(), weight.detach()
        chunk_args = lambda sl: (h[sl], w, targets[sl], part(old, sl), adv[sl], part(ref, sl),  # noqa: E731
                                 slice_plan(plan, sl), temperature)
        need_grad = want_hidden or want_weight
        for start in range(0, hidden.shape[0], chunk):
            sl = slice(start, start + chunk)
            chunk_sum, chunk_totals, grad_logits = chunk_loss(*chunk_args(sl), need_grad)
            loss += chunk_sum
            totals += chunk_totals
            if need_grad:
                out = backprop_chunk(grad_logits, hidden[sl], weight, grad_weight)
                if want_hidden:
                    grad_hidden[sl] = out
        ctx.grads = (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype))
        if defer:  # recomputed chunk by chunk when the sink asks for it (see `weight_grad_later`)
            ctx.later = (weight_grad_sink, chunk_loss, chunk_args, h, chunk)
        ctx.mark_non_differentiable(totals)
        return loss, totals

    @staticmethod
    def backward(ctx, grad_loss, _grad_totals):
        grad_hidden, grad_weight = ctx.grads
        del ctx.grads  # the buffers are this op's own: scale them in place instead of holding a second copy
        scale = lambda g: None if g is None else g.mul_(grad_loss.to(g.dtype))  # noqa: E731
        later = getattr(ctx, "later", None)
        if later is not None:
            del ctx.later
            sink, *recompute = later
            sink(weight_grad_later(*recompute, float(grad_loss)))
        return None, scale(grad_hidden), scale(grad_weight), None, None, None, None, None, None, None, None


def weight_grad_later(chunk_loss: ChunkLoss, chunk_args, hidden: Tensor, chunk: int, grad_loss: float):
    """`add_to(buffer)`: adds grad_loss * d loss / d weight into an fp32 [V, H] buffer, recomputing each chunk's
    logits (one more matmul per chunk than computing it in the forward). A `weight_grad_sink` runs it when the
    buffer may exist: for tied embeddings, at the lookup's backward, after the body's activations are gone."""

    def add_to(buffer: Tensor) -> Tensor:
        for start in range(0, hidden.shape[0], chunk):
            sl = slice(start, start + chunk)
            _, _, grad_logits = chunk_loss(*chunk_args(sl), True)
            buffer.addmm_(grad_logits.T.to(buffer.dtype), hidden[sl].to(buffer.dtype), alpha=grad_loss)
        return buffer

    return add_to


def kernel_chunk_loss(kernels: LossKernels) -> ChunkLoss:
    """The chunk loss of a GPU implementation: the chunk's logits by one matmul, then its fused loss kernel."""

    def chunk_loss(hidden_c, weight, targets_c, old_c, adv_c, ref_c, plan_c, temperature, need_grad):
        logits = (hidden_c @ weight.T).contiguous()
        token_loss, metrics, grad = kernels.loss_forward(logits, targets_c, old_c, adv_c, ref_c, plan_c, temperature)
        return token_loss.sum(), metrics.sum(0), grad

    return chunk_loss


def kernel_chunked_policy_loss(kernels: LossKernels, settings, hidden: Tensor, weight: Tensor, targets: Tensor,
                               old_logprobs: Tensor | None, advantages: Tensor, loss_mask: Tensor, normalizer, *,
                               ref_logprobs: Tensor | None = None, seq_ids: Tensor | None = None,
                               num_sequences: int | None = None, temperature: float = 1.0,
                               chunk_size: int | None = None, with_entropy: bool | None = None,
                               weight_grad_sink=None):
    """`reference.chunked_policy_loss` with a GPU implementation's fused loss kernel on each chunk's logits (the
    kernels compute the entropy anyway; `with_entropy` only decides whether it is reported)."""
    from rl.kernels.reference.chunked import check_hidden, token_chunk
    from rl.kernels.reference.policy_terms import metrics_dict, plan_loss

    check_hidden(hidden, weight, targets)
    if settings.use_kl_loss and ref_logprobs is None:
        raise ValueError("trainer.algorithm.use_kl_loss is on but no ref_logprobs were given")
    plan = plan_loss(settings, normalizer, loss_mask, seq_ids, num_sequences)
    # a chunk holds its logits and their gradient, both in the hidden states' dtype
    chunk = token_chunk(hidden, weight, chunk_size, 2 * hidden.element_size() * weight.shape[0])
    loss, totals = ChunkedLoss.apply(
        kernel_chunk_loss(kernels), hidden, weight, targets.to(torch.int64).contiguous(), old_logprobs, advantages,
        ref_logprobs, plan, float(temperature), chunk, weight_grad_sink,
    )
    reported = settings.use_entropy_loss or bool(with_entropy)
    return loss, metrics_dict(plan, totals, ref_logprobs is not None, has_entropy=reported)
