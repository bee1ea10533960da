"""Python entry points of the Triton kernels: same signatures and results as rl/kernels/reference. The kernels go
through the shared autograd wrappers of rl/kernels/autograd.py as `KERNELS`."""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.kernels import launches
from rl.kernels.autograd import FusedLoss, LossKernels, TokenLogprobs
from rl.kernels.reference.packing import check_lengths
from rl.kernels.reference.policy_terms import metrics_dict, plan_loss
from rl.kernels.sizing import device_of
from rl.kernels.triton.logprobs_kernels import logprobs_bwd_kernel, logprobs_fwd_kernel
from rl.kernels.triton.loss_kernels import fused_loss_kernel
from rl.kernels.triton.packing_kernels import cu_seqlens_kernel, pack_kernel, position_ids_kernel, unpack_kernel


def _as_storage(t: Tensor) -> Tensor:
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def cu_seqlens_from_lengths(lengths: Tensor) -> Tensor:
    check_lengths(lengths)
    cu = torch.empty(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    cu_seqlens_kernel[(1,)](lengths.to(torch.int32).contiguous(), cu, lengths.numel(), BLOCK=256)
    return cu


def position_ids(cu_seqlens: Tensor) -> Tensor:
    total = int(cu_seqlens[-1]) if cu_seqlens.numel() else 0
    out = torch.empty(total, dtype=torch.long, device=cu_seqlens.device)
    num = cu_seqlens.numel() - 1
    if total and num:
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        position_ids_kernel[(num, triton.cdiv(longest, 256))](cu_seqlens.to(torch.int32).contiguous(), out, BLOCK=256)
    return out


def _launch(kernel: str, size: int, t: Tensor, given: dict | None) -> dict:
    """`given` (bench/tune_kernels.py times candidates through it), else the device's recorded or default launch."""
    return given if given is not None else launches.launch(kernel, size, device_of(t.device))


def pack(padded: Tensor, lengths: Tensor, *, launch: dict | None = None) -> Tensor:
    check_lengths(lengths, padded.shape[1])
    cu = cu_seqlens_from_lengths(lengths)
    batch, width = padded.shape[:2]
    feat = padded[0, 0].numel() if padded.numel() else 1
    out = torch.empty((int(cu[-1]), *padded.shape[2:]), dtype=padded.dtype, device=padded.device)
    if out.numel():
        cfg = _launch("pack", feat, padded, launch)
        pack_kernel[(batch, triton.cdiv(width, cfg["BLOCK_T"]))](
            _as_storage(padded.contiguous()), _as_storage(out), cu, width, feat, **cfg
        )
    return out


def unpack(packed: Tensor, lengths: Tensor, width: int, pad_value: float = 0, *, launch: dict | None = None
           ) -> Tensor:
    check_lengths(lengths, width)
    cu = cu_seqlens_from_lengths(lengths)
    out = torch.empty((lengths.numel(), width, *packed.shape[1:]), dtype=packed.dtype, device=packed.device)
    feat = out[0, 0].numel() if out.numel() else 1
    pad = float(pad_value) if packed.dtype.is_floating_point else int(pad_value)
    if out.numel():
        cfg = _launch("unpack", feat, packed, launch)
        unpack_kernel[(lengths.numel(), triton.cdiv(width, cfg["BLOCK_T"]))](
            _as_storage(packed.contiguous()), _as_storage(out), cu, width, feat, pad, **cfg
        )
    return out


def logprobs_forward(logits: Tensor, targets: Tensor, temperature: float, *, launch: dict | None = None):
    n, vocab = logits.shape
    lp, ent, lse = (torch.empty(n, dtype=torch.float32, device=logits.device) for _ in range(3))
    if n:
        logprobs_fwd_kernel[(n,)](
            logits, targets, lp, ent, lse, vocab, logits.stride(0), 1.0 / temperature,
            **_launch("logprobs_fwd", vocab, logits, launch),
        )
    return lp, ent, lse


def logprobs_backward(logits: Tensor, targets: Tensor, temperature: float, lse, ent, grad_lp, grad_ent, *,
              launch: dict | None = None) -> Tensor:
    grad = torch.empty_like(logits)
    n, vocab = logits.shape
    if n:
        cfg = _launch("logprobs_bwd", vocab, logits, launch)
        logprobs_bwd_kernel[(n, triton.cdiv(vocab, cfg["BLOCK_V"]))](
            logits, targets, lse, ent, grad_lp, grad_ent, grad, vocab, logits.stride(0), 1.0 / temperature, **cfg
        )
    return grad


def _contiguous_logits(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits must be [N, V] and targets [N], got {tuple(logits.shape)} and {tuple(targets.shape)}")
    return logits.contiguous(), targets.to(torch.int64).contiguous()


def token_logprobs_entropy(logits: Tensor, targets: Tensor, temperature: float = 1.0):
    logits, targets = _contiguous_logits(logits, targets)
    return TokenLogprobs.apply(KERNELS, logits, targets, float(temperature))


def loss_forward(logits, targets, old, adv, ref, plan, temperature, *, launch: dict | None = None):
    n, vocab = logits.shape
    device = logits.device
    token_loss = torch.zeros(n, dtype=torch.float32, device=device)
    metrics = torch.zeros(n, 6, dtype=torch.float32, device=device)
    grad = torch.empty_like(logits)
    if n:
        f32 = lambda t: t.to(torch.float32).contiguous()  # noqa: E731
        unused = token_loss  # a pointer for the inputs the kernel does not read (no old logprobs, no reference)
        fused_loss_kernel[(n,)](
            logits,
            targets,
            unused if old is None else f32(old),
            f32(adv),
            f32(ref) if ref is not None else unused,
            f32(plan.weight),
            f32(plan.metric_weight),
            f32(plan.token_weight),
            token_loss,
            metrics,
            grad,
            vocab,
            logits.stride(0),
            1.0 / temperature,
            plan.eps_clip_low,
            plan.eps_clip_high,
            plan.clip_ratio_c,
            plan.kl_coef,
            plan.entropy_coef,
            POLICY=plan.policy,
            KL=plan.kl,
            HAS_REF=ref is not None,
            USE_KL=plan.use_kl,
            USE_ENT=plan.use_entropy,
            ON_POLICY=old is None,
            **_launch("fused_loss", vocab, logits, launch),
        )
    return token_loss, metrics, grad


KERNELS = LossKernels("triton", logprobs_forward, logprobs_backward, loss_forward)


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
):
    logits, targets = _contiguous_logits(logits, targets)
    if settings.use_kl_loss and ref_logprobs is None:
        raise ValueError("trainer.algorithm.use_kl_loss is on but no ref_logprobs were given")
    plan = plan_loss(settings, normalizer, loss_mask, seq_ids, num_sequences)
    loss, totals = FusedLoss.apply(
        KERNELS, logits, targets, old_logprobs, advantages, ref_logprobs, plan, float(temperature)
    )
    return loss, metrics_dict(plan, totals, ref_logprobs is not None)
