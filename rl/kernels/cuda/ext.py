"""Torch-facing wrappers of the CUDA extension: same signatures and results as rl/kernels/reference.

Tensors go to the extension as `data_ptr()` with torch's current stream, so no libtorch C++ is involved. The
kernels go through the shared autograd wrappers of rl/kernels/autograd.py as `KERNELS`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.kernels.autograd import FusedLoss, LossKernels, TokenLogprobs
from rl.kernels.cuda.loader import require
from rl.kernels.reference.packing import check_lengths
from rl.kernels.reference.policy_terms import metrics_dict, plan_loss

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


def _dtype_code(logits: Tensor) -> int:
    if logits.dtype not in _DTYPES:
        raise ValueError(f"the CUDA kernels take float32 or bfloat16 logits, got {logits.dtype}")
    return _DTYPES[logits.dtype]


def _f32(t: Tensor) -> Tensor:
    return t.to(torch.float32).contiguous()


def cu_seqlens_from_lengths(lengths: Tensor) -> Tensor:
    check_lengths(lengths)
    lengths = lengths.to(torch.int32).contiguous()
    cu = torch.empty(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    require().cu_seqlens(lengths.data_ptr(), cu.data_ptr(), lengths.numel(), _stream(cu))
    return cu


def position_ids(cu_seqlens: Tensor) -> Tensor:
    cu = cu_seqlens.to(torch.int32).contiguous()
    total = int(cu[-1]) if cu.numel() else 0
    out = torch.empty(total, dtype=torch.long, device=cu.device)
    if total:
        longest = int((cu[1:] - cu[:-1]).max())
        require().position_ids(cu.data_ptr(), out.data_ptr(), cu.numel() - 1, longest, _stream(out))
    return out


def pack(padded: Tensor, lengths: Tensor) -> Tensor:
    check_lengths(lengths, padded.shape[1])
    cu = cu_seqlens_from_lengths(lengths)
    padded = padded.contiguous()
    out = torch.empty((int(cu[-1]), *padded.shape[2:]), dtype=padded.dtype, device=padded.device)
    feat = out[0].numel() if out.numel() else 1
    if out.numel():
        require().pack(
            padded.data_ptr(),
            out.data_ptr(),
            cu.data_ptr(),
            lengths.numel(),
            padded.shape[1],
            feat,
            padded.element_size(),
            _stream(out),
        )
    return out


def _bits(value: float, dtype: torch.dtype) -> int:
    size = torch.empty(0, dtype=dtype).element_size()
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    return int(torch.tensor([value], dtype=dtype).view(as_int).item()) & ((1 << 64) - 1)


def unpack(packed: Tensor, lengths: Tensor, width: int, pad_value: float = 0) -> Tensor:
    check_lengths(lengths, width)
    cu = cu_seqlens_from_lengths(lengths)
    packed = packed.contiguous()
    out = torch.empty((lengths.numel(), width, *packed.shape[1:]), dtype=packed.dtype, device=packed.device)
    feat = out[0, 0].numel() if out.numel() else 1
    if out.numel():
        require().unpack(
            packed.data_ptr(),
            out.data_ptr(),
            cu.data_ptr(),
            lengths.numel(),
            width,
            feat,
            packed.element_size(),
            _bits(pad_value, packed.dtype),
            _stream(out),
        )
    return out


def _forward(logits: Tensor, targets: Tensor, temperature: float):
    n, vocab = logits.shape
    lp, ent, lse = (torch.empty(n, dtype=torch.float32, device=logits.device) for _ in range(3))
    require().logprobs_forward(
        logits.data_ptr(),
        _dtype_code(logits),
        targets.data_ptr(),
        lp.data_ptr(),
        ent.data_ptr(),
        lse.data_ptr(),
        n,
        vocab,
        logits.stride(0),
        1.0 / temperature,
        _stream(logits),
    )
    return lp, ent, lse


def _backward(logits: Tensor, targets: Tensor, temperature: float, lse, ent, grad_lp, grad_ent) -> Tensor:
    grad = torch.empty_like(logits)
    n, vocab = logits.shape
    require().logprobs_backward(
        logits.data_ptr(),
        _dtype_code(logits),
        targets.data_ptr(),
        lse.data_ptr(),
        ent.data_ptr(),
        _f32(grad_lp).data_ptr(),
        _f32(grad_ent).data_ptr(),
        grad.data_ptr(),
        n,
        vocab,
        logits.stride(0),
        1.0 / temperature,
        _stream(logits),
    )
    return grad


def _prepare(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits must be [N, V] and targets [N], got {tuple(logits.shape)} and {tuple(targets.shape)}")
    _dtype_code(logits)
    return logits.contiguous(), targets.to(torch.int64).contiguous()


def token_logprobs_entropy(logits: Tensor, targets: Tensor, temperature: float = 1.0):
    logits, targets = _prepare(logits, targets)
    return TokenLogprobs.apply(KERNELS, logits, targets, float(temperature))


def _loss_forward(logits, targets, old, adv, ref, plan, temperature):
    n, vocab = logits.shape
    token_loss = torch.zeros(n, dtype=torch.float32, device=logits.device)
    metrics = torch.zeros(n, 6, dtype=torch.float32, device=logits.device)
    grad = torch.empty_like(logits)
    has_ref = ref is not None
    if old is None:  # on-policy: this forward's own logprobs, detached
        old = _forward(logits, targets, temperature)[0]
    old, adv = _f32(old), _f32(adv)
    ref = _f32(ref) if has_ref else old
    weights = [_f32(w) for w in (plan.weight, plan.metric_weight, plan.token_weight)]
    settings = {
        "policy": plan.policy,
        "kl": plan.kl,
        "has_ref": has_ref,
        "use_kl": plan.use_kl,
        "use_entropy": plan.use_entropy,
        "inv_temp": 1.0 / temperature,
        "eps_low": plan.eps_clip_low,
        "eps_high": plan.eps_clip_high,
        "clip_c": plan.clip_ratio_c,
        "kl_coef": plan.kl_coef,
        "entropy_coef": plan.entropy_coef,
    }
    require().fused_loss(
        logits.data_ptr(),
        _dtype_code(logits),
        targets.data_ptr(),
        old.data_ptr(),
        adv.data_ptr(),
        ref.data_ptr(),
        *(w.data_ptr() for w in weights),
        token_loss.data_ptr(),
        metrics.data_ptr(),
        grad.data_ptr(),
        n,
        vocab,
        logits.stride(0),
        settings,
        _stream(logits),
    )
    return token_loss, metrics, grad


KERNELS = LossKernels("cuda", _forward, _backward, _loss_forward)


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
    logits, targets = _prepare(logits, targets)
    if settings.use_kl_loss and ref_logprobs is None:
        raise ValueError("trainer.algorithm.use_kl_loss is on but no ref_logprobs were given")
    plan = plan_loss(settings, normalizer, loss_mask, seq_ids, num_sequences)
    loss, totals = FusedLoss.apply(
        KERNELS, logits, targets, old_logprobs, advantages, ref_logprobs, plan, float(temperature)
    )
    return loss, metrics_dict(plan, totals, ref_logprobs is not None)
