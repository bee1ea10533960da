"""Torch reference ops against plain eager formulas and rl/core's `compute_policy_loss` (the independent oracles)."""

import pytest
import torch

from rl.core.algorithms import compute_policy_loss
from rl.core.algorithms.kl import K3_BOUND
from rl.kernels import reference as ref_ops
from rl.kernels.reference.policy_terms import plan_loss
from tests.rl.kernels.cases import LENGTHS, SETTINGS, eager_logprobs, oracle_loss, packed_batch
from tests.testing.loss_gaps import log_softmax_gaps, log_softmax_grad_gap, policy_loss_gaps
from tests.testing.tolerances import assert_within, matmul_gap, network_rtol, rounded_gap


# Bounds from tests/testing/tolerances.py. A logprob is z_t/T - logsumexp(z/T) and an entropy is logsumexp(z/T) -
# sum p z/T: each side reduces over the vocabulary twice (the normaliser, the entropy's weighted sum; a blocked pass
# rescales its partial sums once per block, fewer roundings than the vocabulary's) in its own order, relative to
# the row's logits, so the gap is network_rtol([vocab, vocab]) * (max|z/T| + |value|) (1 + that for the exp's and
# log's own roundings).
def _row_scale(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return 1 + (logits.detach().float() / temperature).abs().amax(-1)


def _logprob_bounds(logits, lp0, h0, temperature):
    rtol = network_rtol([logits.shape[-1]] * 2, torch.float32)
    rows = _row_scale(logits, temperature)
    return rtol * (rows + lp0.detach().abs()), rtol * (rows + h0.detach())


def _logits_grad_bound(logits, targets, w1, w2, temperature, reductions, dtype, want):
    """d/dz_j of sum w1 lp + w2 H is (w1 (1[j = t] - p_j) - w2 p_j (log p_j + H)) / T: each p_j carries the row's
    gap relative to its logits (`_row_scale`), and the gradient's terms are summed in each side's order over
    `reductions` (the vocabulary twice, the tokens where a loss weights them); a weight of None (a term the loss leaves
    out) is 0; a bf16 gradient is rounded once more (`rounded_gap`)."""
    with torch.no_grad():
        logp = torch.log_softmax(logits.detach().float() / temperature, -1)
        p, entropy = logp.exp(), -(logp.exp() * logp).sum(-1, keepdim=True)
        w1, w2 = (torch.zeros(len(targets), 1) if w is None else w.detach().abs().float()[:, None] for w in (w1, w2))
        scale = (w1 * p + w2 * p * (logp.abs() + entropy)) / temperature
        scale[torch.arange(len(targets)), targets] += w1[:, 0] / temperature
        bound = network_rtol(reductions, torch.float32) * scale * _row_scale(logits, temperature)[:, None]
        return rounded_gap(want, bound, dtype) if dtype != torch.float32 else bound


def _loss_bound(b, lp0, h0, logits, temperature, dp, clip_c, old=None):
    """A loss or metric is a reduction over the tokens (weights summing to <= dp_world_size) of per-token terms of
    (logprob, entropy) whose slope is at most the ratio times |advantage| (dual clip caps it at c), plus the KL
    estimators' exp(|log-ratio|) and |log-ratio| and 1: each token's inputs carry `_logprob_bounds`, and its term's
    magnitude is at most its slope times the same scale, summed over the tokens in each side's order."""
    lp_gap, h_gap = _logprob_bounds(logits, lp0, h0, temperature)
    lp = lp0.detach()
    old = b.old if old is None else old
    slope = (1 + b.adv.abs() * torch.clamp((lp - old).abs().exp(), min=clip_c) + (lp - b.ref).abs().exp()
             + (lp - b.ref).abs())
    terms = slope * (lp_gap + h_gap)
    rtol = network_rtol([len(lp)], torch.float32)
    scale = slope * (_row_scale(logits, temperature) + lp.abs() + h0.detach())
    return float(dp * (terms.max() + rtol * scale.max())) if len(lp) else 0.0


def test_cu_seqlens_and_position_ids_by_hand():
    cu = ref_ops.cu_seqlens_from_lengths(torch.tensor([2, 0, 1, 3]))
    assert cu.tolist() == [0, 2, 2, 3, 6] and cu.dtype == torch.int32
    assert ref_ops.position_ids(cu).tolist() == [0, 1, 0, 0, 1, 2]
    assert ref_ops.position_ids(ref_ops.cu_seqlens_from_lengths(torch.tensor([0, 0]))).numel() == 0


def test_pack_unpack_round_trip_by_hand():
    padded = torch.tensor([[1, 2, 9], [9, 9, 9], [3, 9, 9], [4, 5, 6]])
    lengths = torch.tensor([2, 0, 1, 3])
    packed = ref_ops.pack(padded, lengths)
    assert packed.tolist() == [1, 2, 3, 4, 5, 6]
    back = ref_ops.unpack(packed, lengths, 3, pad_value=-1)
    assert back.tolist() == [[1, 2, -1], [-1, -1, -1], [3, -1, -1], [4, 5, 6]]
    feats = torch.randn(4, 3, 5)
    torch.testing.assert_close(ref_ops.unpack(ref_ops.pack(feats, lengths), lengths, 3)[0, :2], feats[0, :2])
    with pytest.raises(ValueError, match="exceeds the padded width"):
        ref_ops.pack(padded, torch.tensor([4, 0, 0, 0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_token_logprobs_entropy_matches_log_softmax(dtype, temperature):
    b = packed_batch(dtype=dtype)
    logits = b.logits.clone().requires_grad_()
    lp, h = ref_ops.token_logprobs_entropy(logits, b.targets, temperature, block_size=7)
    eager_in = b.logits.clone().requires_grad_()
    lp0, h0 = eager_logprobs(eager_in, b.targets, temperature)
    lp_gap, h_gap = _logprob_bounds(b.logits, lp0, h0, temperature)
    assert lp.dtype == h.dtype == torch.float32
    assert_within(lp, lp0, lp_gap, "logprob")
    assert_within(h, h0, h_gap, "entropy")
    w1, w2 = torch.randn(lp.shape), torch.randn(lp.shape)
    (g,) = torch.autograd.grad((lp * w1 + h * w2).sum(), logits)
    (g0,) = torch.autograd.grad((lp0 * w1 + h0 * w2).sum(), eager_in)
    vocab = b.logits.shape[-1]
    assert_within(g, g0, _logits_grad_bound(b.logits, b.targets, w1, w2, temperature, [vocab, vocab], dtype, g0),
                  "logits gradient")
    assert g.dtype == dtype


def test_logprobs_handle_masked_vocabulary():
    logits = torch.randn(4, 10)
    logits[:, 0:6] = float("-inf")  # the first two vocabulary blocks are fully masked
    logits.requires_grad_()
    targets = torch.tensor([6, 7, 8, 9])
    lp, h = ref_ops.token_logprobs_entropy(logits, targets, block_size=3)
    live = logits.detach()[:, 6:].clone().requires_grad_()  # oracle: the unmasked columns alone
    lp0, h0 = eager_logprobs(live, targets - 6)
    torch.testing.assert_close(lp, lp0)
    torch.testing.assert_close(h, h0)
    (grad,) = torch.autograd.grad((lp + h).sum(), logits)
    (grad0,) = torch.autograd.grad((lp0 + h0).sum(), live)
    assert torch.equal(grad[:, :6], torch.zeros(4, 6))
    torch.testing.assert_close(grad[:, 6:], grad0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("block_size", [None, 7])
def test_logprobs_without_entropy_match_log_softmax(dtype, temperature, block_size):
    """The logprob-only path (no entropy in either pass) against eager log_softmax, and the logits stay untouched."""
    b = packed_batch(dtype=dtype)
    logits = b.logits.clone().requires_grad_()
    lp, h = ref_ops.token_logprobs_entropy(logits, b.targets, temperature, block_size=block_size, with_entropy=False)
    assert h is None
    eager_in = b.logits.clone().requires_grad_()
    lp0, h0 = eager_logprobs(eager_in, b.targets, temperature)
    assert lp.dtype == torch.float32
    assert_within(lp, lp0, _logprob_bounds(b.logits, lp0, h0, temperature)[0], "logprob")
    w = torch.randn(lp.shape)
    (g,) = torch.autograd.grad((lp * w).sum(), logits)
    (g0,) = torch.autograd.grad((lp0 * w).sum(), eager_in)
    vocab = b.logits.shape[-1]
    bound = _logits_grad_bound(b.logits, b.targets, w, torch.zeros_like(w), temperature, [vocab, vocab], dtype, g0)
    assert_within(g, g0, bound, "logits gradient")
    assert g.dtype == dtype and torch.equal(logits.detach(), b.logits)


def test_unused_entropy_output_skips_its_gradient_term():
    """With the entropy computed but left out of the loss, the gradient is the logprob-only one."""
    b = packed_batch()
    logits = b.logits.clone().requires_grad_()
    lp, _ = ref_ops.token_logprobs_entropy(logits, b.targets, 0.8, block_size=5)
    (g,) = torch.autograd.grad(lp.sum(), logits)
    eager_in = b.logits.clone().requires_grad_()
    (g0,) = torch.autograd.grad(eager_logprobs(eager_in, b.targets, 0.8)[0].sum(), eager_in)
    torch.testing.assert_close(g, g0)


def test_logprobs_without_entropy_handle_masked_vocabulary():
    logits = torch.randn(4, 10)
    logits[:, 0:6] = float("-inf")
    logits.requires_grad_()
    targets = torch.tensor([6, 7, 8, 9])
    lp, _ = ref_ops.token_logprobs_entropy(logits, targets, block_size=3, with_entropy=False)
    live = logits.detach()[:, 6:].clone().requires_grad_()
    lp0, _ = eager_logprobs(live, targets - 6)
    torch.testing.assert_close(lp, lp0)
    (grad,) = torch.autograd.grad(lp.sum(), logits)
    (grad0,) = torch.autograd.grad(lp0.sum(), live)
    assert torch.equal(grad[:, :6], torch.zeros(4, 6))
    torch.testing.assert_close(grad[:, 6:], grad0)


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("dp", [1, 2])
def test_fused_loss_matches_compute_policy_loss(name, dp):
    settings = SETTINGS[name]
    b = packed_batch()
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences, dp_world_size=dp)
    logits = b.logits.clone().requires_grad_()
    loss, metrics = ref_ops.fused_policy_loss(
        settings,
        logits,
        b.targets,
        b.old,
        b.adv,
        b.mask,
        normalizer,
        ref_logprobs=b.ref,
        seq_ids=b.seq_ids,
        num_sequences=b.num_sequences,
        temperature=0.8,
        block_size=16,
    )
    loss.backward()
    eager_in = b.logits.clone().requires_grad_()
    lp0, h0 = eager_logprobs(eager_in, b.targets, 0.8)
    lp0.retain_grad(), h0.retain_grad()
    loss0, metrics0 = oracle_loss(settings, lp0, h0, b, normalizer)
    loss0.backward()
    # The loss weights each token's logprob and entropy by lp0.grad and h0.grad, summed over the tokens.
    vocab, tokens = b.logits.shape[-1], len(b.targets)
    bound = _logits_grad_bound(b.logits, b.targets, lp0.grad, h0.grad, 0.8, [tokens, vocab, vocab], torch.float32,
                               eager_in.grad)
    assert_within(logits.grad, eager_in.grad, bound, "logits gradient")
    scalar = _loss_bound(b, lp0, h0, b.logits, 0.8, dp, settings.clip_ratio_c)
    assert_within(loss, loss0, scalar, "loss")
    assert set(metrics) == set(metrics0)
    for key in metrics0:
        assert_within(metrics[key], metrics0[key], scalar, key)


def test_fused_loss_rejects_gspo_naming_the_key():
    from rl.core.algorithms import LossSettings

    settings = LossSettings(policy_loss_type="gspo", loss_reduction="sequence_mean")
    b = packed_batch()
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences)
    with pytest.raises(ValueError, match=r"trainer\.algorithm\.policy_loss_type"):
        ref_ops.fused_policy_loss(settings, b.logits, b.targets, b.old, b.adv, b.mask, normalizer)


def _chunked_grad_bounds(hidden, weight, logits, targets, w1, w2, temperature, dtype, logits_grad, logit_gap,
                         w1_gap=0.0):
    """Both sides' gradients of hidden and weight: the logits' gradient G (`log_softmax_grad_gap` at logits that
    differ by `logit_gap`, cast to the weight's dtype before the matmuls), then hidden's G @ weight over the
    vocabulary and weight's G.T @ hidden over the tokens (`matmul_gap`, each rounded to bf16 for bf16 inputs)."""
    grad_gap = log_softmax_grad_gap(logits, targets, w1, w2, temperature, logit_gap=logit_gap, w1_gap=w1_gap,
                                    dtype=dtype, grad=logits_grad)
    return (lambda want: matmul_gap(logits_grad, weight, grad_gap, dtype=dtype, result=want),
            lambda want: matmul_gap(logits_grad.T, hidden, grad_gap.T, dtype=dtype, result=want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_logprobs_match_full_logits(dtype):
    g = torch.Generator().manual_seed(1)
    n, hdim, vocab = sum(LENGTHS), 12, 40
    # Inputs on a grid of 1/4 in [-2, 2]: every product is a multiple of 1/16 and every partial sum of a logit one
    # below 2^6, so the logits are exact in float32 whatever the order (a chunk's rows or all of them) and, for bf16,
    # each side rounds the same exact value: both sides' logits agree bit for bit.
    hidden = (torch.randint(-8, 9, (n, hdim), generator=g) / 4).to(dtype).requires_grad_()
    weight = (torch.randint(-8, 9, (vocab, hdim), generator=g) / 4).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=g)
    lp, h = ref_ops.chunked_token_logprobs(hidden, weight, targets, 0.9, chunk_size=5)
    logits0 = hidden @ weight.T
    assert torch.equal(logits0, (hidden.detach().double() @ weight.detach().double().T).to(dtype))
    lp0, h0 = eager_logprobs(logits0, targets, 0.9)
    lp_gap, h_gap = log_softmax_gaps(logits0, targets, 0.9)
    assert_within(lp, lp0, lp_gap, "logprob")
    assert_within(h, h0, h_gap, "entropy")
    w1, w2 = torch.randn(n, generator=g), torch.randn(n, generator=g)
    grads = torch.autograd.grad((lp * w1 + h * w2).sum(), (hidden, weight))
    *grads0, logits_grad = torch.autograd.grad((lp0 * w1 + h0 * w2).sum(), (hidden, weight, logits0))
    bounds = _chunked_grad_bounds(hidden, weight, logits0, targets, w1, w2, 0.9, dtype, logits_grad, 0.0)
    for got, want, bound, name in zip(grads, grads0, bounds, ("hidden", "weight"), strict=True):
        assert got.dtype == dtype
        assert_within(got, want, bound(want), f"{name} gradient")


def _policy_loss_bounds(settings, b, normalizer, lp0, h0, lp_gap, h_gap, old=None):
    """`policy_loss_gaps` of the loss and its metrics (by name) and of the loss's slope per token, with the kernels'
    per-token weights (`plan_loss`)."""
    plan = plan_loss(settings, normalizer, b.mask, b.seq_ids, b.num_sequences)
    weights = {"loss": plan.weight, "metric": plan.metric_weight, "token": plan.token_weight}
    return policy_loss_gaps(lp0, old, b.ref, b.adv, weights, lp_gap, h_gap, h0, settings, K3_BOUND)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_chunked_loss_matches_compute_policy_loss(name):
    settings = SETTINGS[name]
    b = packed_batch(vocab=40)
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(b.targets.numel(), 12, generator=g, requires_grad=True)
    weight = torch.randn(40, 12, generator=g, requires_grad=True)
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences)
    loss, metrics = ref_ops.chunked_policy_loss(
        settings,
        hidden,
        weight,
        b.targets,
        b.old,
        b.adv,
        b.mask,
        normalizer,
        ref_logprobs=b.ref,
        seq_ids=b.seq_ids,
        num_sequences=b.num_sequences,
        chunk_size=4,
        with_entropy=True,
    )
    grads = torch.autograd.grad(2.0 * loss, (hidden, weight))
    logits0 = hidden @ weight.T
    lp0, h0 = eager_logprobs(logits0, b.targets)
    loss0, metrics0 = oracle_loss(settings, lp0, h0, b, normalizer)
    *grads0, logits_grad, w1, w2 = torch.autograd.grad(2.0 * loss0, (hidden, weight, logits0, lp0, h0),
                                                       allow_unused=True)
    # The chunks' logits (`matmul_gap`), their logprobs and entropies (`log_softmax_gaps`), the loss and metrics over
    # the tokens (`policy_loss_gaps`); the gradient of 2 * loss weights each token's logprob and entropy by w1, w2,
    # whose logprob slope moves along the gap (twice the slope gap).
    logit_gap = matmul_gap(hidden, weight.T)
    lp_gap, h_gap = log_softmax_gaps(logits0, b.targets, 1.0, logit_gap)
    value_gaps, slope_gap = _policy_loss_bounds(settings, b, normalizer, lp0, h0, lp_gap, h_gap, old=b.old)
    assert_within(loss, loss0, value_gaps["loss"], "loss")
    bounds = _chunked_grad_bounds(hidden, weight, logits0, b.targets, w1, w2, 1.0, torch.float32, logits_grad,
                                  logit_gap, 2 * slope_gap)
    for got, want, bound, part in zip(grads, grads0, bounds, ("hidden", "weight"), strict=True):
        assert_within(got, want, bound(want), f"{part} gradient")
    assert set(metrics) == set(metrics0)
    for key in metrics0:
        assert_within(metrics[key], metrics0[key], value_gaps[key], key)


def test_empty_batch_gives_zero_loss_and_empty_gradient():
    settings = SETTINGS["dual_clip-seq_mean-kl_k3-entropy"]
    b = packed_batch(lengths=[0, 0])
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences)
    logits = b.logits.clone().requires_grad_()
    loss, metrics = ref_ops.fused_policy_loss(
        settings, logits, b.targets, b.old, b.adv, b.mask, normalizer, ref_logprobs=b.ref, seq_ids=b.seq_ids
    )
    loss.backward()
    assert float(loss.detach()) == 0.0 and logits.grad.shape == (0, 50)
    assert all(float(v) == 0.0 for v in metrics.values())
    lp, ent = ref_ops.token_logprobs_entropy(b.logits, b.targets)
    assert lp.shape == ent.shape == (0,)


def test_chunked_loss_skips_the_entropy_metric_when_unused():
    settings = SETTINGS["regular-token_mean"]
    b = packed_batch(vocab=40)
    hidden, weight = torch.randn(b.targets.numel(), 8), torch.randn(40, 8)
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences)
    _, metrics = ref_ops.chunked_policy_loss(
        settings, hidden, weight, b.targets, b.old, b.adv, b.mask, normalizer, seq_ids=b.seq_ids
    )
    lp0, _ = eager_logprobs(hidden @ weight.T, b.targets)
    _, metrics0 = compute_policy_loss(settings, lp0, b.old, b.adv, b.mask, normalizer, seq_ids=b.seq_ids)
    assert set(metrics) == set(metrics0)
