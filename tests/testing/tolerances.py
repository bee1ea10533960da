"""The one rule for comparing two floating-point computations of the same quantity.

Two computations of one value in different orders (batched vs single, sharded vs whole, fused vs eager, another CPU
kernel path) differ by rounding only. Most bounds below are derived: they follow from the dtype's unit roundoff and
the size of the computation, and hold on every machine. One is not: `network_rtol` (and `logprob_gap`,
`gradient_gap`, which build on it) is an empirical bound, a heuristic with a margin measured, not a proof (see its
docstring). `tools/bound_margins.sh` measures every comparison's margin under each CPU kernel path; the table is in
tests/README.md. None is a number fitted to one machine's kernels.

- Unit roundoff u: the largest relative error of one rounding, 2^-p for a p-bit significand (float64 2^-53,
  float32 2^-24, bfloat16 2^-8, float16 2^-11).
- A sum of k terms computed in any order has error <= gamma_k * sum|terms| (Higham, Accuracy and Stability of
  Numerical Algorithms, 2nd ed., Lemma 3.1 and eq. 3.5), gamma_k = k*u / (1 - k*u). Two orders each lie within that
  of the exact sum, so they differ by <= 2 * gamma_k * sum|terms|. A chain of reductions (a network: matmul after
  matmul) compounds as gamma_{k1} + gamma_{k2} + ... <= gamma_{k1+k2+...} relative to the sums of |terms| met
  along the way (Higham eq. 3.8 and Lemma 3.3).
- A value stored in a lower precision (a bf16 result of an fp32 computation) is rounded once more: two results
  whose fp32 values agree to within e differ by <= e + 2 * u_bf16 * |value| after rounding (each rounding moves
  its value by at most u|value|).
- Adam divides each gradient by its own running magnitude, so an element whose gradient is near its rounding error
  can flip its update from +lr to -lr: see `adam_gap`.

Where the code can run both sides in float64, that is the cleanest use of this rule: the bound is then ~1e-13
relative, orders of magnitude below any real bug, and no CPU kernel path can approach it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tests.testing import margins

UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: the largest relative error of rounding one real number to `dtype` (round to nearest)."""
    return UNIT_ROUNDOFF[dtype]


def lr_schedule_gap(lr: float, steps: int = 1) -> float:
    """How far two float64 evaluations of one scheduled learning rate can be apart (rl.core.algorithms.lr_schedule
    against a peer's schedule, or against a rate written out by hand): each takes a dozen-odd roundings (the
    progress, the cosine, the products and sums with lr and min_lr) of terms no larger than lr, 16 per step of a
    schedule that updates the rate from the previous one (`steps`, torch's chainable CosineAnnealingLR)."""
    return gamma(16 * steps, torch.float64) * lr


def gamma(k: int, dtype: torch.dtype) -> float:
    """Higham's gamma_k = k*u / (1 - k*u): the relative error bound of a k-term sum or dot product in any order,
    relative to the sum of the terms' magnitudes. Valid while k*u < 1."""
    ku = k * unit_roundoff(dtype)
    if ku >= 1:
        raise ValueError(f"gamma_{k} is unbounded in {dtype}: k*u = {ku} >= 1")
    return ku / (1 - ku)


def reordered_sum_gap(k: int, abs_sum: float | torch.Tensor, dtype: torch.dtype) -> float | torch.Tensor:
    """Largest gap between two computations of the same k-term sum in different orders: 2 * gamma_k * sum|terms|."""
    return 2 * gamma(k, dtype) * abs_sum


def network_rtol(reductions: Sequence[int], dtype: torch.dtype, condition: float = 1.0) -> float:
    """Relative gap of two evaluations of a network whose output passes through reductions of the given sizes
    (one entry per matmul, attention sum, softmax/norm sum on the path from input to output). Empirical, not derived.

    Each reduction contributes gamma_k relative to its own sum of |terms|; chained, they add up to at most
    gamma_{sum k}, twice for two orders. That much is Higham's. Applying it to the output's largest magnitude is the
    heuristic: it leaves out how an early rounding error grows through later layers (weights whose norm exceeds 1,
    softmax's sensitivity) and how far sum|terms| exceeds |result| where terms cancel. It holds in this suite because
    the worst-case gamma_k overestimates the typical (random-walk, ~sqrt(k) u) error by far more than that growth, on
    the small models the tests build: tools/bound_margins.sh shows the margin under each kernel path (tests/README.md,
    "Bound margins"). A network much deeper or worse conditioned than the tests' needs `condition` > 1 or a float64
    oracle. `condition` scales the bound for sums known to cancel. Compare with `atol = rtol * scale` where scale
    is the magnitude of the compared values (not an element that happens to be near zero).
    """
    return 2 * gamma(sum(reductions), dtype) * condition


def decoder_reductions(config, positions: int, tokens: int = 0, adapter_rank: int = 0) -> list[int]:
    """The reductions on the path through a decoder-only transformer's forward and backward, for `network_rtol`:
    the loss and weight-gradient sums over `tokens` (0 when no loss is compared), the vocabulary's softmax, the final
    norm and the head over the hidden size; per layer two norms and four projections over the hidden size, the MLP's
    inner size, a head's width, the attention's softmax and weighted sum over `positions` (the longest sequence),
    and a LoRA adapter's two projections over its rank. `config` is a transformers config or its config.json."""
    get = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    hidden = get("hidden_size") or get("n_embd")
    inner = get("intermediate_size") or get("n_inner") or 4 * hidden
    heads = get("num_attention_heads") or get("n_head")
    layers = get("num_hidden_layers") or get("n_layer")
    adapters = [adapter_rank, adapter_rank] if adapter_rank else []
    per_layer = [hidden] * 6 + [inner, hidden // heads, positions, positions] + adapters
    return [tokens, get("vocab_size"), hidden, hidden] + per_layer * layers


def vision_tower_reductions(config, patches: int) -> list[int]:
    """The reductions through Qwen2-VL's (or Qwen2.5-VL's) vision tower, for `network_rtol`: the patch embedding
    over channels x frames x patch^2; per block two norms, the qkv and output projections over its width, the
    attention's softmax and weighted sum over an image's `patches`, the MLP's two projections; the merger's norm and
    two projections over merge^2 x width and the output width. `config` is the model's `vision_config`."""
    width = getattr(config, "embed_dim", None) or config.hidden_size
    inner = getattr(config, "intermediate_size", None) or int(width * config.mlp_ratio)
    patch = config.in_channels * config.temporal_patch_size * config.patch_size ** 2
    per_block = [width] * 4 + [patches, patches, inner]
    merged = width * config.spatial_merge_size ** 2
    return [patch] + per_block * config.depth + [width, merged, merged]


def logprob_gap(config, logits: torch.Tensor, positions: int, dtype: torch.dtype = torch.float32) -> float:
    """Gap bound of two computations of a decoder's log-probabilities (or logits) over sequences of up to
    `positions` tokens in different orders (packed vs alone, cached decoding vs one pass, batched vs single):
    `network_rtol` of the forward's reductions relative to the logits' magnitude, since a log-softmax is a logit
    minus a log-sum-exp of logits."""
    return network_rtol(decoder_reductions(config, positions), dtype) * float(logits.detach().abs().max())


def gradient_gap(grad: torch.Tensor, reductions: Sequence[int], dtype: torch.dtype = torch.float32) -> float:
    """Gap bound of one weight gradient computed in two orders: `network_rtol` of the forward and backward's
    reductions relative to the tensor's largest |element| (rounding scales with the terms summed, not with an
    element that cancels to ~0)."""
    return network_rtol(reductions, dtype) * float(grad.detach().abs().max())


def rounded_gap(value: torch.Tensor, inner_gap: float | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gap of two results that agree to within `inner_gap` before each is rounded to `dtype` (a bf16 output of an
    fp32 kernel): inner_gap + 2 * u(dtype) * |value|."""
    return inner_gap + 2 * unit_roundoff(dtype) * value.abs().float()


def assert_within(got: torch.Tensor, want: torch.Tensor, bound: float | torch.Tensor, msg: str = "") -> None:
    """Element-wise |got - want| <= bound (a scalar or a tensor like `want`), reporting the worst element. A NaN in
    either side or in the bound fails (a gap of NaN is no gap within any bound); infinities pass only where both
    sides hold the same one."""
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, f"{msg}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    bound = torch.as_tensor(bound, dtype=torch.float64, device=want.device).expand_as(want)
    same_infinity = torch.isinf(got) & (got == want)
    gap = torch.where(same_infinity, torch.zeros_like(got), (got - want).abs())
    excess = torch.nan_to_num(gap - bound, nan=math.inf)
    margins.record(gap, bound, msg)
    worst = int(excess.argmax()) if excess.numel() else 0
    if excess.numel() and float(excess.flatten()[worst]) > 0:
        g, w, b = (float(t.flatten()[worst]) for t in (got, want, bound))
        bad = int((excess > 0).sum())
        raise AssertionError(f"{msg}: {bad} of {want.numel()} elements out of bound; worst at {worst}: "
                             f"got {g!r}, want {w!r}, |gap| {abs(g - w):.3g} > bound {b:.3g}")


def adam_weights(betas: tuple[float, float], step: int) -> tuple[list[float], list[float]]:
    """Bias-corrected weights a_i, b_i of gradient i (1-based, i <= step) in Adam's m_hat and v_hat at `step`:
    m_hat = sum a_i g_i, v_hat = sum b_i g_i^2."""
    b1, b2 = betas
    a = [(1 - b1) * b1 ** (step - i) / (1 - b1**step) for i in range(1, step + 1)]
    b = [(1 - b2) * b2 ** (step - i) / (1 - b2**step) for i in range(1, step + 1)]
    return a, b


def adam_gap(grads: Sequence[torch.Tensor], grad_gaps: Sequence[torch.Tensor | float], lr: float,
             betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.Tensor:
    """Per-element bound on how far two runs of Adam(W) (no weight decay) drift apart in T steps when run 2's
    gradients differ from run 1's `grads` (the oracle's, per step) by at most `grad_gaps` (same shapes, or scalars).

    Step t moves a weight by lr * u_t, u_t = N/D with N = sum a_i g_i, D = sqrt(sum b_i g_i^2) + eps
    (`adam_weights`). With gradient errors |d_i| <= r_i:
      |N' - N| <= sum a_i r_i,   |sqrt(V') - sqrt(V)| <= s = sqrt(sum b_i r_i^2)   (triangle inequality, weighted
      L2 norm),   D' >= max(D - s, eps),
    so |u' - u| <= (sum a_i r_i + |u| s) / max(D - s, eps). Both |u| and |u'| are at most
    sqrt(sum a_i^2 / b_i) (Cauchy-Schwarz), so the gap is also capped at twice that: a gradient buried in its
    rounding noise can flip the update's sign (about 2 lr), one far above it moves the update by ~lr*r/|g|.
    The weights drift by at most lr * sum_t |u'_t - u_t|.
    """
    total = torch.zeros_like(grads[0], dtype=torch.float64)
    for t in range(1, len(grads) + 1):
        a, b = adam_weights(betas, t)
        g = [x.double() for x in grads[:t]]
        r = [torch.as_tensor(x, dtype=torch.float64, device=g[0].device).expand_as(g[0]) for x in grad_gaps[:t]]
        n = sum(ai * gi for ai, gi in zip(a, g, strict=True))
        d = torch.sqrt(sum(bi * gi * gi for bi, gi in zip(b, g, strict=True))) + eps
        s = torch.sqrt(sum(bi * ri * ri for bi, ri in zip(b, r, strict=True)))
        dn = sum(ai * ri for ai, ri in zip(a, r, strict=True))
        cap = 2 * math.sqrt(sum(ai * ai / bi for ai, bi in zip(a, b, strict=True)))
        total += torch.minimum((dn + (n / d).abs() * s) / torch.clamp(d - s, min=eps), torch.tensor(cap))
    return lr * total


def adam_update_rtol(dtype: torch.dtype) -> float:
    """Relative gap of one Adam update computed by two implementations (fused or not) from the same m, v: the
    moments' two multiply-adds, the square root, the add of eps, the division and the bias corrections each round
    once, so each update is within ~8u of exact; two implementations differ by <= 16u relative to |lr * u_t|."""
    return 16 * unit_roundoff(dtype)


def adam_step_bound(betas: tuple[float, float], step: int) -> float:
    """Largest |m_hat / (sqrt(v_hat) + eps)| Adam can take at `step`, whatever the gradients: with the weights of
    `adam_weights`, |sum a_i g_i| <= sqrt(sum a_i^2 / b_i) * sqrt(sum b_i g_i^2) (Cauchy-Schwarz), and eps only
    shrinks the ratio. It holds for any gradients, so clipping (which rescales a step's gradient) cannot raise it;
    1 at step 1, ~1.0-1.3 for the first steps at the default betas."""
    a, b = adam_weights(betas, step)
    return math.sqrt(sum(ai * ai / bi for ai, bi in zip(a, b, strict=True)))


def adam_drift(lr: float, steps: int, betas: tuple[float, float] = (0.9, 0.999)) -> float:
    """Worst-case distance of one weight between two runs of `steps` Adam(W) steps from the same start at learning
    rate <= lr (warm-up only lowers it): each run moves the weight by at most lr * `adam_step_bound` per step, so two
    runs end at most 2 * lr * sum_t bound_t apart. Decoupled weight decay scales both by (1 - lr * wd) <= 1, which
    shrinks the gap. A gradient within its rounding error of zero can reach this: its update's sign is noise."""
    return 2 * lr * sum(adam_step_bound(betas, t) for t in range(1, steps + 1))


# Per Adam(W) step a weight is written twice (the decoupled decay's multiply, then the update's add): each rounds to
# within u|w|, so two runs whose exact results agree can still differ by 2u|w| per write.
ADAM_WRITES_PER_STEP = 2


def adam_bulk_gap(weights: torch.Tensor, lr: float, steps: int, grad_rtol: float, dtype: torch.dtype,
                  betas: tuple[float, float] = (0.9, 0.999)) -> torch.Tensor:
    """Per-element bound on two runs' weights after `steps` Adam(W) steps for an element whose gradient differs
    between the runs by at most `grad_rtol` relative in every step (a gradient well above its rounding noise).

    With |g'_i - g_i| <= e|g_i|, `adam_gap`'s |u' - u| <= (sum a_i r_i + |u| s) / (D - s) becomes
    <= 2 e / (1 - e) * bound_t (sum a_i |g_i| <= bound_t * sqrt(V), Cauchy-Schwarz), the update's own arithmetic
    adds `adam_update_rtol` * bound_t, and each write of the weight rounds (`ADAM_WRITES_PER_STEP`, 2u|w| apart
    per write, |w| at most the final weight plus the run's whole drift)."""
    bounds = sum(adam_step_bound(betas, t) for t in range(1, steps + 1))
    update = lr * bounds * (2 * grad_rtol / (1 - grad_rtol) + adam_update_rtol(dtype))
    largest = weights.detach().abs().double() + lr * bounds
    return update + 2 * ADAM_WRITES_PER_STEP * steps * unit_roundoff(dtype) * largest


def assert_adam_runs_within(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], lr: float, steps: int,
                            grad_rtol: float, outlier_share: float, betas: tuple[float, float] = (0.9, 0.999),
                            msg: str = "") -> int:
    """Two runs' weights after `steps` Adam(W) steps, when the gradients are not at hand (a launcher run exports
    weights only), so `adam_gap` cannot be applied per element:
    - in every tensor, all but ceil(outlier_share * numel) elements within `adam_bulk_gap` at `grad_rtol`: the
      check of the gradients. Only elements whose gradient came within its rounding noise of zero in some step
      (their update's sign is noise) may leave it; a wrong shard merge, a wrong learning rate or a missing or wrong
      gradient moves most of a tensor's elements, not a few. A NaN counts as beyond it.
    - those few elements within `adam_drift`, the farthest any gradients move an element in `steps` steps at `lr`:
      it bounds how far a noise-signed update can go and catches a value no such run reaches (a corrupted element,
      another start); it holds whatever the gradients were, so it checks the weights, never the gradients.
    Returns the largest number of bulk outliers in one tensor."""
    drift = adam_drift(lr, steps, betas)
    worst = 0
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape, f"{msg} {name}: shape {tuple(g.shape)} vs {tuple(w.shape)}"
        bulk = adam_bulk_gap(w, lr, steps, grad_rtol, w.dtype, betas)
        outside = ~((g.double() - w.double()).abs() <= bulk)
        allowed = math.ceil(outlier_share * w.numel())
        assert int(outside.sum()) <= allowed, (
            f"{msg} {name}: {int(outside.sum())} of {w.numel()} elements beyond the bulk bound (at most {allowed} "
            "may be gradients within rounding noise of zero)")
        assert bool(torch.isfinite(g[outside]).all()), f"{msg} {name}: not finite"
        assert_within(g[outside], w[outside], drift, f"{msg} {name} (beyond the bulk bound: Adam's worst-case drift)")
        worst = max(worst, int(outside.sum()))
    return worst


# An exponential's or logarithm's relative error, in units of u: numpy's float32 exp and log (what Triton's
# interpreter runs) are within 2.52 and 3.83 ulps (as NumPy documents them), torch's within 1 ulp, and one ulp of a
# value is at most 2u of it.
EXP_ROUNDINGS, LOG_ROUNDINGS = 6, 8


def formula_gap(magnitude: torch.Tensor, roundings: float | torch.Tensor, dtype: torch.dtype = torch.float32
                ) -> torch.Tensor:
    """Per-element gap of two implementations of one closed-form expression evaluated element by element in `dtype`
    (a registry's torch function and a kernel's formula; torch's and Triton's arithmetic): each is within gamma_k of
    `magnitude` of the exact value, so they differ by <= 2 gamma_k * magnitude (Higham's model: fl(a op b) =
    (a op b)(1 + d), |d| <= u, and Lemma 3.1). `roundings` k counts the operations on an element's path: each +, -,
    *, / one; an exp or log `EXP_ROUNDINGS`, `LOG_ROUNDINGS`; an exponential of a rounded argument x |x| more (the
    argument's error u|x| becomes e^x's relative error |x| u). `magnitude`: the sum of the magnitudes of the terms
    met (the value itself when nothing cancels); both may be per-element tensors."""
    ku = torch.as_tensor(roundings, dtype=torch.float64, device=magnitude.device) * unit_roundoff(dtype)
    if bool((ku >= 1).any()):
        raise ValueError(f"gamma_k is unbounded in {dtype}: k*u = {float(ku.max())} >= 1")
    return 2 * ku / (1 - ku) * magnitude.detach().double().abs()


def matmul_gap(a: torch.Tensor, b: torch.Tensor, a_gap: float | torch.Tensor = 0.0, b_gap: float | torch.Tensor = 0.0,
               dtype: torch.dtype = torch.float32, result: torch.Tensor | None = None) -> torch.Tensor:
    """Per-element gap of two computations of a @ b ([M, K] @ [K, N]) whose inputs differ by at most `a_gap` and
    `b_gap` per element (0: the same inputs): the inputs' gaps carried through the products (a_gap @ |b| +
    |a| @ b_gap + a_gap @ b_gap), each side's own K-term sums in float32 in its own order (`network_rtol([K])` of
    (|a| + a_gap) @ (|b| + b_gap)), and for a result stored in a lower `dtype` (bf16 with float32 accumulation) its
    rounding on each side (`rounded_gap` of `result`, either side's value)."""
    a, b = a.detach().double(), b.detach().double()
    a_gap = torch.as_tensor(a_gap, dtype=torch.float64, device=a.device).expand_as(a)
    b_gap = torch.as_tensor(b_gap, dtype=torch.float64, device=b.device).expand_as(b)
    big_a, big_b = a.abs() + a_gap, b.abs() + b_gap
    carried = a_gap @ b.abs() + a.abs() @ b_gap + a_gap @ b_gap
    gap = carried + network_rtol([a.shape[-1]], torch.float32) * (big_a @ big_b)
    if dtype == torch.float32 or dtype == torch.float64:
        return gap
    assert result is not None, "a result stored in a lower precision rounds: pass it as `result`"
    return rounded_gap(result.detach().double(), gap, dtype)


def weighted_mean_gap(weights: Sequence[float], magnitudes: Sequence[float], samples: int) -> float:
    """Gap between a step's mean of float32 weighted sums, mean_b(sum_s w_s r_sb) (each sample's total built in a
    float32 tensor, source by source: the float64 product rounded to float32 and added, 2 roundings a source; then
    the mean over `samples`: a sum and a division), and sum_s w_s mean_b(r_sb) computed in float64 (each source's
    mean, its average over draws, the weighted sum). Each side is within gamma_k of the magnitudes met,
    (1/B) sum_b sum_s |w_s r_sb| <= sum_s |w_s| m_s, `magnitudes` m_s: a source's mean |score| (its logged mean when
    its scores are >= 0) or a bound on its |score|."""
    sources = len(weights)
    magnitude = sum(abs(w) * m for w, m in zip(weights, magnitudes, strict=True))
    rounding = gamma(2 * sources + samples + 1, torch.float32) + gamma(samples + 2 * sources + 4, torch.float64)
    return rounding * magnitude


def trained_model_logprob_gap(model_path: str, lr: float, steps: int) -> float:
    """How far two float32 forwards' logprobs of one token (an engine's and the trainer's, or the policy's and the
    reference's) can sit at the same weights, for the model at `model_path` after at most `steps` Adam steps at
    `lr` (`logprob_gap` over the longest position). The run's logits are not at hand, so the largest |logit| is
    bounded from the weights: the final RMSNorm's output has L2 norm at most sqrt(hidden) * max|gain| and a logit
    is an LM-head row's product with it (Cauchy-Schwarz); each element moved by at most `adam_drift` / 2 from its
    initial value (the head's row norm by that times sqrt(hidden))."""
    import json
    import os

    from transformers import AutoModelForCausalLM

    with open(os.path.join(model_path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    head, gain = model.get_output_embeddings().weight.detach(), model.model.norm.weight.detach()
    hidden = head.shape[1]
    moved = adam_drift(lr, steps) / 2
    largest = (head.norm(dim=1).max() + moved * hidden**0.5) * (gain.abs().max() + moved) * hidden**0.5
    return logprob_gap(config, largest, config["max_position_embeddings"])
