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


def _softmax_parts(logits: torch.Tensor, temperature: float):
    z = logits.detach().double() / temperature
    logp = torch.log_softmax(z, -1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    return z, logp, p, entropy


def log_softmax_gaps(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                     logit_gap: float | torch.Tensor = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row gaps of two float32 computations of a token's log-probability log p_t = z_t/T - logsumexp(z/T) and of
    the entropy H = logsumexp(z/T) - sum_j p_j z_j/T from `logits` [N, V] (either side's), when the two sides' logits
    differ by at most `logit_gap` per element (0: the same logits; `matmul_gap` for logits each side computes):
    - each side reduces over the vocabulary twice (the normaliser, the entropy's weighted sum; a blocked or
      vocabulary-parallel pass rescales its partial sums, fewer roundings than the vocabulary's) in its own order,
      relative to the row's scale 1 + max|z/T| plus the value for the exp's and log's own roundings:
      `network_rtol([V, V])` of that;
    - logits that differ by at most g_j move log p_t by <= g_t/T + D, D = max_j g_j / T (logsumexp is 1-Lipschitz in
      the max norm), and H by <= 2 log(V) D (|dH/dz|_1 = sum_j p_j |log p_j + H| / T <= 2H / T <= 2 log(V) / T).
    Returns (logprob gap [N], entropy gap [N]), float64."""
    z, logp, _, entropy = _softmax_parts(logits, temperature)
    lp = logp.gather(1, targets.long()[:, None]).squeeze(1)
    rtol = network_rtol([z.shape[-1]] * 2, torch.float32)
    rows = 1 + z.abs().amax(-1)
    shift = torch.as_tensor(logit_gap, dtype=torch.float64, device=z.device).expand_as(z) / temperature
    d = shift.amax(-1)
    lp_gap = rtol * (rows + lp.abs()) + shift.gather(1, targets.long()[:, None]).squeeze(1) + d
    h_gap = rtol * (rows + entropy) + 2 * math.log(z.shape[-1]) * d
    return lp_gap, h_gap


def log_softmax_grad_gap(logits: torch.Tensor, targets: torch.Tensor, w1: torch.Tensor | None,
                         w2: torch.Tensor | None, temperature: float = 1.0, reductions: Sequence[int] | None = None,
                         logit_gap: float | torch.Tensor = 0.0, w1_gap: float | torch.Tensor = 0.0,
                         dtype: torch.dtype = torch.float32, grad: torch.Tensor | None = None) -> torch.Tensor:
    """Per-element gap [N, V] of two computations of the gradient of sum_t (w1_t log p_t + w2_t H_t) w.r.t. the
    logits, G_j = (w1 (1[j = t] - p_j) - w2 p_j (log p_j + H)) / T per row (w1, w2: [N], None for a term left out):
    - each side's own float32 arithmetic: `network_rtol(reductions)` (default: the vocabulary twice, as in
      `log_softmax_gaps`) relative to the terms' magnitude (|w1| (1[j=t] + p_j) + |w2| p_j (|log p_j| + H)) / T
      times the row's scale 1 + max|z/T| (each p_j carries its row's rounding relative to the logits);
    - logits that differ by at most g (D = max_j g_j / T per row): p_j moves by <= p_j E, E = e^(2D) - 1, log p_j by
      <= 2D and H by <= 2 log(V) D (`log_softmax_gaps`), so by the product rule G_j by
      <= (|w1| p_j E + |w2| p_j (E (|log p_j| + H) + e^(2D) 2D (1 + log V))) / T;
    - weights w1 that differ by at most `w1_gap` (a loss's slope at the two sides' logprobs, `policy_loss_gaps`):
      w1_gap (1[j=t] + p_j) / T;
    - a gradient stored in a lower `dtype` rounds once more on each side (`rounded_gap` of `grad`)."""
    z, logp, p, entropy = _softmax_parts(logits, temperature)
    rows, vocab = z.shape
    zero = torch.zeros(rows, dtype=torch.float64, device=z.device)
    w1 = zero if w1 is None else w1.detach().double().abs()
    w2 = zero if w2 is None else w2.detach().double().abs()
    w1, w2, h = w1[:, None], w2[:, None], entropy[:, None]
    onehot = torch.zeros_like(z).scatter_(1, targets.long()[:, None], 1.0)
    terms = (w1 * (onehot + p) + w2 * p * (logp.abs() + h)) / temperature
    rtol = network_rtol([vocab, vocab] if reductions is None else reductions, torch.float32)
    gap = rtol * terms * (1 + z.abs().amax(-1, keepdim=True))
    as_gap = lambda x: torch.as_tensor(x, dtype=torch.float64, device=z.device)  # noqa: E731
    d = (as_gap(logit_gap).expand_as(z) / temperature).amax(-1, keepdim=True)
    grow = torch.expm1(2 * d)
    gap = gap + (w1 * p * grow + w2 * p * (grow * (logp.abs() + h) + (1 + grow) * 2 * d * (1 + math.log(vocab))))
    gap = gap + as_gap(w1_gap).expand(rows)[:, None] * (onehot + p) / temperature
    if dtype == torch.float32 or dtype == torch.float64:
        return gap
    assert grad is not None, "a gradient stored in a lower precision rounds: pass it as `grad`"
    return rounded_gap(grad.detach().double(), gap, dtype)


def _surrogate(policy: str, adv: torch.Tensor, ratio: torch.Tensor, logprob: torch.Tensor, low: float, high: float,
               cap: float) -> torch.Tensor:
    """Per-token value of a clipped surrogate at `ratio` (float64): regular max(-A r, -A clip(r)), dual_clip that
    capped at -A c where A < 0, cispo -A min(r, 1 + eps_high) log p (the weight's gradient stopped)."""
    if policy == "cispo":
        return -adv * ratio.clamp(max=high) * logprob
    value = torch.maximum(-adv * ratio, -adv * ratio.clamp(low, high))
    if policy == "dual_clip":
        value = torch.where(adv < 0, torch.minimum(value, -adv * cap), value)
    return value


def _kl(estimator: str, x: torch.Tensor, cap: float) -> torch.Tensor:
    """An estimator's value at x = log p - log p_ref (float64): k1 x, abs |x|, k2 x^2/2, k3 e^-x + x - 1 (at most
    `cap`)."""
    if estimator == "k1":
        return x
    if estimator == "abs":
        return x.abs()
    if estimator == "k2":
        return 0.5 * x * x
    return (torch.exp(-x) + x - 1).clamp(max=cap)


def policy_loss_gaps(logprobs: torch.Tensor, old: torch.Tensor | None, ref: torch.Tensor | None,
                     advantages: torch.Tensor, weights: dict[str, torch.Tensor], lp_gap: torch.Tensor,
                     h_gap: torch.Tensor | float, entropy: torch.Tensor | None, settings,
                     kl_cap: float = math.inf) -> tuple[dict[str, float], torch.Tensor]:
    """Two float32 computations of a policy loss and its metrics, each a weighted sum over the N tokens of per-token
    terms of the token's logprob (and entropy), when the two sides' logprobs differ by at most `lp_gap` and their
    entropies by `h_gap` ([N]); `logprobs`, `entropy`: either side's. `weights`: per-token weights, "loss" (with the
    data-parallel factor), "metric" (pg_loss, kl, entropy) and "token" (the clip fractions, ppo_kl); `old` None is
    on-policy (the ratio is 1 on both sides, whatever their logprobs). `settings`: the loss's settings
    (rl.core.algorithms.LossSettings, read by attribute); `kl_cap`: k3's cap (rl.core's K3_BOUND).

    Each term moves by at most its largest slope within the token's interval [log p - gap, log p + gap] times the gap
    (the mean value theorem), the terms' slopes being monotone or constant between kinks: the surrogate's (`policy`:
    regular, dual_clip, cispo) |A| r at the interval's end where unclipped, 0 where clipped (cispo: |A| (min(r, 1 +
    eps_high) + |log p| r) while r < 1 + eps_high); the KL estimator's (k1 and abs 1, k2 |x|, k3 |1 - e^-x|
    below its cap, 0 above) at the interval's ends; the entropy's and ppo_kl's 1. A clip fraction counts a token
    differently only where its interval reaches a clip edge (1 - eps_low, 1 + eps_high; c for the lower fraction).
    Each side's sum over the N tokens (and the few roundings of each weight: a division by a count and by the
    denominator, the world size, a coefficient) is within gamma_(N+4) of the sum of the terms' magnitudes.

    Returns (value gaps by metric name, "loss" included; slope gap [N]): the slope gap bounds how far the loss's
    slope in a token's logprob (the gradient's weight w1 of `log_softmax_grad_gap`) moves within the interval: the
    surrogate's |A| (r_hi - r_lo) where unclipped, its jump |A| r_hi where the interval reaches a clip edge; the
    KL's (k2 2 gap, k3 |e^-x_lo - e^-x_hi|), its jump at a kink within the interval (abs at 0: 2, k3's cap: its
    slope), times kl_coef."""
    policy, clip_ratio_c = settings.policy_loss_type, settings.clip_ratio_c
    assert policy in ("regular", "dual_clip", "cispo"), f"no per-token bound for the {policy} loss"
    kl = settings.kl_estimator_type
    kl_coef = settings.kl_loss_coef if settings.use_kl_loss else 0.0
    entropy_coef = settings.entropy_loss_coef if settings.use_entropy_loss else 0.0
    f64 = lambda t: t.detach().double()  # noqa: E731
    lp = f64(logprobs)
    n = lp.numel()
    gap = torch.as_tensor(lp_gap, dtype=torch.float64, device=lp.device).expand_as(lp)
    adv = f64(advantages)
    low, high = 1 - settings.eps_clip_low, 1 + settings.eps_clip_high
    log_ratio = torch.zeros_like(lp) if old is None else lp - f64(old)
    moves = torch.zeros_like(lp) if old is None else gap  # on-policy: the ratio is 1 on both sides
    r, r_lo, r_hi = torch.exp(log_ratio), torch.exp(log_ratio - moves), torch.exp(log_ratio + moves)
    lp_hi = lp.abs() + gap

    # the surrogate: where along the interval it is unclipped (its slope -A r), and its edges
    if policy == "cispo":
        active = torch.ones_like(lp, dtype=torch.bool)
        moving = (r_lo < high) & (old is not None)  # the ratio's own move, where unclipped and not on-policy
        pg_slope = adv.abs() * (r_hi.clamp(max=high) + lp_hi * r_hi * moving)
        pg_grad_gap = adv.abs() * (r_hi.clamp(max=high) - r_lo.clamp(max=high))
        edges = [high]
    else:
        top = clip_ratio_c if policy == "dual_clip" else math.inf
        active = torch.where(adv > 0, r_lo <= high, torch.where(adv < 0, (r_hi >= low) & (r_lo <= top), False))
        pg_slope = torch.where(active, adv.abs() * r_hi, 0.0)
        edges = [low, high] + ([clip_ratio_c] if policy == "dual_clip" else [])
        pg_grad_gap = torch.where(active, adv.abs() * (r_hi - r_lo), 0.0)
    reaches = lambda edge: (r_lo <= edge) & (edge <= r_hi)  # noqa: E731
    near = torch.zeros_like(lp, dtype=torch.bool)
    for edge in edges:
        near |= reaches(edge)
    near_lower = reaches(clip_ratio_c) if policy == "dual_clip" else torch.zeros_like(near)
    if policy != "cispo":  # cispo's slope -A min(r, 1 + eps_high) has no jump
        pg_grad_gap = pg_grad_gap + torch.where(near, adv.abs() * r_hi, 0.0)
    pg = _surrogate(policy, adv, r, lp, low, high, clip_ratio_c).abs() + pg_slope * gap

    # the KL estimator at x = log p - log p_ref, over [x - gap, x + gap]
    kl_slope = kl_grad_gap = kl_value = torch.zeros_like(lp)
    if ref is not None:
        x = lp - f64(ref)
        x_lo, x_hi = x - gap, x + gap
        v_lo, v_hi = _kl(kl, x_lo, kl_cap), _kl(kl, x_hi, kl_cap)
        kl_value = torch.maximum(v_lo.abs(), v_hi.abs())
        if kl in ("k1", "abs"):
            kl_slope = torch.ones_like(lp)
            kl_grad_gap = 2.0 * ((x_lo <= 0) & (x_hi >= 0)) if kl == "abs" else torch.zeros_like(lp)
        elif kl == "k2":
            kl_slope, kl_grad_gap = torch.maximum(x_lo.abs(), x_hi.abs()), 2 * gap
        else:
            k3_slope = torch.maximum((1 - torch.exp(-x_lo)).abs(), (1 - torch.exp(-x_hi)).abs())
            raw_lo, raw_hi = torch.exp(-x_lo) + x_lo - 1, torch.exp(-x_hi) + x_hi - 1
            smallest = torch.where((x_lo <= 0) & (x_hi >= 0), 0.0, torch.minimum(raw_lo, raw_hi))
            capped = smallest >= kl_cap  # constant over the whole interval
            crosses = (~capped) & (torch.maximum(raw_lo, raw_hi) >= kl_cap)
            kl_slope = torch.where(capped, 0.0, k3_slope)
            kl_grad_gap = torch.where(capped, 0.0, (torch.exp(-x_lo) - torch.exp(-x_hi)).abs())
            kl_grad_gap = kl_grad_gap + torch.where(crosses, k3_slope, 0.0)
    kl_term = kl_value + kl_slope * gap

    h = torch.zeros_like(lp) if entropy is None else f64(entropy)
    h_gap = torch.as_tensor(h_gap, dtype=torch.float64, device=lp.device).expand_as(lp)
    rtol = network_rtol([n + 4], torch.float32)

    def total(weight: torch.Tensor, moved: torch.Tensor, magnitude: torch.Tensor) -> float:
        w = f64(weight).abs()
        return float((w * moved).sum() + rtol * (w * magnitude).sum())

    w_loss, w_metric, w_token = weights["loss"], weights["metric"], weights["token"]
    loss_moved = pg_slope * gap + kl_coef * kl_slope * gap + entropy_coef * h_gap
    loss_magnitude = pg + kl_coef * kl_term + entropy_coef * (h + h_gap)
    ppo_moved = torch.zeros_like(lp) if old is None else gap
    gaps = {
        "loss": total(w_loss, loss_moved, loss_magnitude),
        "pg_loss": total(w_metric, pg_slope * gap, pg),
        "kl": total(w_metric, kl_slope * gap, kl_term),
        "entropy": total(w_metric, h_gap, h + h_gap),
        "pg_clipfrac": total(w_token, near.double(), torch.ones_like(lp)),
        "pg_clipfrac_lower": total(w_token, near_lower.double(), torch.ones_like(lp)),
        "ppo_kl": total(w_token, ppo_moved, log_ratio.abs() + ppo_moved),
    }
    gaps["kl_loss"] = gaps["kl"]
    return gaps, f64(w_loss).abs() * (pg_grad_gap + kl_coef * kl_grad_gap)


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
