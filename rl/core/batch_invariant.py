"""Batch-invariant arithmetic (`trainer.exact_on_policy`): a token's logits and logprob come out to the same bits
whatever else is in the batch, how it is padded or packed, and whether its keys come from a KV cache or from the
same forward, so the generation engine's sampling logprobs and the trainer's equal each other bit for bit.

A kernel is batch-invariant when the order of every sum it takes depends only on the shapes that belong to one
token. BLAS matmul, sdpa and the vectorised reductions choose their blocking from the whole tensor, so here every
sum is a fixed pairwise tree built from elementwise adds (`tree_sum`): over a feature dimension (a linear layer's
inputs, a head's dimension, a norm's hidden size, the vocabulary) its shape is fixed by the dimension's size; over
keys (attention's softmax denominator and its weighted values) masked and padded keys are exact zeros, and the tree
pairs entries whose positions agree modulo a power of two, which a shift of all of them (left padding, another
sequence's keys before them in a cache or a packed row) does not change. A maximum is exact in any order, and
elementwise adds and multiplies are correctly rounded wherever they run.

An elementwise transcendental (exp, log, rsqrt, cos, sin, the MLP's activation) runs on a buffer padded to whole
vector blocks (`elementwise`): CPU kernels finish a tensor's last elements with a scalar loop whose result can
differ from the vector loop's in the last bit (silu under avx2 and avx512), so an element must never land in that
tail. With more than one intra-op thread a kernel splits its range at thread boundaries and each piece has a tail
again, so `elementwise` works in pieces no larger than one thread's grain.

Gradients do not need the same order (only the logprobs the engine reports are compared), so the linear layer and
attention keep the arithmetic above in their forward only and take their backward from the ordinary formulas.
`make_batch_invariant(model)` swaps these in on a Hugging Face decoder (Llama, Qwen2 and others of that layout).
"""

from __future__ import annotations

import types

import torch
from torch import Tensor, nn

NAME = "batch_invariant"  # the attention implementation's name in transformers
VECTOR_BLOCK = 64  # a multiple of every CPU vector loop's step (AVX-512: 16 floats, unrolled twice)
GRAIN = 32768  # ATen's grain: an elementwise kernel over this many elements or fewer runs as one piece
PRODUCTS = 1 << 22  # elements of the products a linear layer or attention holds at once (a chunk of rows)
CPU_ONLY = ("its batch-invariant arithmetic is checked bit for bit on CPU only (no GPU run has checked it yet); set "
            "trainer.exact_on_policy=false on GPUs")


def elementwise(fn, x: Tensor) -> Tensor:
    """`fn(x)` for an elementwise `fn`, with every element computed by the kernel's vector loop (see above)."""
    flat = x.reshape(-1)
    count = flat.numel()
    pad = (-count) % VECTOR_BLOCK
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    pieces = [fn(flat[start:start + GRAIN]) for start in range(0, flat.numel(), GRAIN)]
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    return out[:count].reshape(x.shape)


def tree_sum(x: Tensor) -> Tensor:
    """The sum over the last dimension as a pairwise tree fixed by its length: [..., n] -> [...]."""
    width = 1 << max(x.shape[-1] - 1, 0).bit_length()
    if width != x.shape[-1]:
        x = torch.nn.functional.pad(x, (0, width - x.shape[-1]))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def _row_chunk(per_row: int) -> int:
    return max(1, PRODUCTS // max(per_row, 1))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        rows = x.reshape(-1, x.shape[-1]).float()
        w = weight.float()
        step = _row_chunk(w.numel())
        out = torch.cat([tree_sum(rows[i:i + step, None, :] * w[None]) for i in range(0, rows.shape[0], step)])
        if bias is not None:
            out = out + bias.float()
        return out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        grad_x = (flat @ weight.to(flat.dtype)).reshape(x.shape).to(x.dtype)
        grad_w = (flat.t() @ x.reshape(-1, x.shape[-1]).to(flat.dtype)).to(weight.dtype)
        grad_b = flat.sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`x @ weight.T + bias`, each output a tree sum over the inputs in fp32."""
    return _Linear.apply(x, weight, bias)


def log_softmax(x: Tensor) -> Tensor:
    """log softmax over the last dimension, fp32."""
    x = x.float()
    shifted = x - x.amax(-1, keepdim=True)
    total = tree_sum(elementwise(torch.exp, shifted))
    return shifted - elementwise(torch.log, total)[..., None]


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / T)[target] per row: [N, V], [N] -> [N] fp32."""
    scaled = logits.float() / temperature if temperature != 1.0 else logits.float()
    return log_softmax(scaled).gather(-1, targets[:, None]).squeeze(-1)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Llama's RMSNorm: the mean of squares a tree sum, the reciprocal square root on whole vector blocks."""
    dtype = x.dtype
    x = x.float()
    mean = tree_sum(x * x) / x.shape[-1]
    scale = elementwise(torch.rsqrt, mean + eps)
    return weight * (x * scale[..., None]).to(dtype)


def _attend(query: Tensor, key: Tensor, value: Tensor, allowed: Tensor, scale: float) -> Tensor:
    """query [B, H, Q, D], key/value [B, H, K, D], allowed [B|1, H|1, Q, K] bool -> [B, H, Q, D] fp32."""
    q, k, v = query.float(), key.float(), value.float()
    step = _row_chunk(q.shape[0] * q.shape[1] * k.shape[2] * q.shape[3])
    outs = []
    for i in range(0, q.shape[2], step):
        scores = tree_sum(q[:, :, i:i + step, None, :] * k[:, :, None, :, :]) * scale  # [B, H, q, K]
        scores = scores.masked_fill(~allowed[:, :, i:i + step], float("-inf"))
        top = scores.amax(-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a query with no key (padding)
        weights = elementwise(torch.exp, scores - top)
        total = tree_sum(weights)[..., None]
        summed = tree_sum((weights[..., None] * v[:, :, None, :, :]).transpose(-1, -2))  # [B, H, q, D]
        outs.append(summed / torch.where(total > 0, total, torch.ones_like(total)))
    return torch.cat(outs, dim=2)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query: Tensor, key: Tensor, value: Tensor, allowed: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(query, key, value, allowed)
        ctx.scale = scale
        return _attend(query, key, value, allowed, scale).to(query.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        query, key, value, allowed = ctx.saved_tensors
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
            scores = (q @ k.transpose(-1, -2)) * ctx.scale
            weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
            grads = torch.autograd.grad(weights @ v, (q, k, v), grad)
        return *grads, None, None


def causal_mask(queries: int, keys: int, device: torch.device, window: int | None = None) -> Tensor:
    """[queries, keys] bool, the queries being the last `queries` of the keys' positions: query i sees key j when
    0 <= distance (< window), the distance being their positions' difference."""
    distance = (torch.arange(queries, device=device)[:, None] + keys - queries) - torch.arange(keys, device=device)
    allowed = distance >= 0
    return allowed & (distance < window) if window is not None else allowed


def attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers attention function: query [B, H, Q, D], key/value [B, Hkv, K, D] -> ([B, Q, H, D], None).
    A packed row (flash attention's `cu_seq_lens_q`) attends sequence by sequence; otherwise the mask given, or
    causal attention when there is none."""
    if dropout:
        raise ValueError("batch-invariant attention runs without dropout; set the model's attention_dropout to 0")
    if kwargs.get("s_aux") is not None:
        raise ValueError("batch-invariant attention does not cover attention sinks")
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    window = kwargs.get("sliding_window")
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is not None and query.shape[0] == 1 and int(bounds[-1]) == query.shape[2] == key.shape[2]:
        pieces = []
        for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            allowed = causal_mask(end - start, end - start, query.device, window)[None, None]
            pieces.append(_Attention.apply(*(t[:, :, start:end] for t in (query, key, value)), allowed, scale))
        out = torch.cat(pieces, dim=2)
    else:
        if attention_mask is None:
            allowed = causal_mask(query.shape[2], key.shape[2], query.device, window)[None, None]
        elif attention_mask.dtype == torch.bool:
            allowed = attention_mask[..., -key.shape[2]:]
        else:  # an additive mask: 0 where allowed, the dtype's minimum or -inf elsewhere
            allowed = attention_mask[..., -key.shape[2]:] == 0
        out = _Attention.apply(query, key, value, allowed, scale)
    return out.transpose(1, 2).contiguous(), None


def _causal_mask_always(*args, **kwargs):
    """transformers' sdpa mask, always materialised (never skipped as "plain causal"): the attention above reads it."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def register() -> str:
    """Makes `attn_implementation="batch_invariant"` known to transformers; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(NAME, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, _causal_mask_always)
    return NAME


def _linear_forward(self: nn.Linear, x: Tensor) -> Tensor:
    return linear(x, self.weight, self.bias)


def _rms_norm_forward(self: nn.Module, x: Tensor) -> Tensor:
    return rms_norm(x, self.weight, _norm_eps(self))


def _norm_eps(module: nn.Module) -> float | None:
    """An RMSNorm's epsilon: transformers' `variance_epsilon`, or `eps` (torch's RMSNorm and some models')."""
    return getattr(module, "variance_epsilon", getattr(module, "eps", None))


def _rotary_forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
    freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
    angles = torch.cat((freqs, freqs), dim=-1)
    cos = elementwise(torch.cos, angles) * self.attention_scaling
    sin = elementwise(torch.sin, angles) * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class _Activation(nn.Module):
    """An MLP's elementwise activation, computed on whole vector blocks."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        return elementwise(self.inner, x)


def make_batch_invariant(model: nn.Module) -> nn.Module:
    """Swaps the batch-invariant arithmetic into a Hugging Face decoder in place: every linear layer, RMSNorm,
    rotary embedding and MLP activation, and its attention implementation; returns the model. Refuses a model
    with a part it does not cover (a norm with a bias, a rotary scaling other than the default)."""
    if any(param.device.type != "cpu" for param in model.parameters()):
        raise ValueError(f"trainer.exact_on_policy: {type(model).__name__} is not on the CPU; {CPU_ONLY}")
    register()
    for name, module in list(model.named_modules()):
        kind = type(module).__name__
        if isinstance(module, nn.Linear):
            module.forward = types.MethodType(_linear_forward, module)
        elif kind.endswith("RMSNorm"):
            if _norm_eps(module) is None or getattr(module, "bias", None) is not None:
                raise ValueError(f"{name} ({kind}): exact on-policy covers RMSNorm with a weight and no bias")
            module.forward = types.MethodType(_rms_norm_forward, module)
        elif kind.endswith("RotaryEmbedding"):
            if getattr(module, "rope_type", "default") != "default":
                raise ValueError(f"{name} ({kind}): exact on-policy covers the default rotary embedding, not "
                                 f"{module.rope_type!r}")
            module.forward = types.MethodType(_rotary_forward, module)
        elif isinstance(getattr(module, "act_fn", None), nn.Module) and not isinstance(module.act_fn, _Activation):
            module.act_fn = _Activation(module.act_fn)
        elif isinstance(module, nn.LayerNorm | nn.Conv1d | nn.Conv2d | nn.Conv3d):
            raise ValueError(f"{name} ({kind}): exact on-policy does not cover this layer")
    model.set_attn_implementation(NAME)
    return model
