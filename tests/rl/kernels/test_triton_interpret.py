"""Triton kernels under TRITON_INTERPRET=1 on CPU at tiny sizes, against the torch reference and eager formulas."""

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton runs on CPU only with TRITON_INTERPRET=1 (the Bazel target sets it)", allow_module_level=True)

from rl.core.algorithms import compute_policy_loss
from rl.core.algorithms.kl import K3_BOUND
from rl.kernels import launches
from rl.kernels import reference as ref_ops
from rl.kernels.launches import RECORD_ENV
from rl.kernels.reference.policy_terms import plan_loss
from rl.kernels.sizing import PACK_KERNELS, ROW_KERNELS, candidate_launches
from rl.kernels.triton import ops as tri
from tests.rl.kernels.cases import SETTINGS, LaunchSpy, eager_logprobs, oracle_loss, packed_batch
from tests.testing.loss_gaps import log_softmax_gaps, log_softmax_grad_gap, policy_loss_gaps
from tests.testing.tolerances import assert_within, matmul_gap

# Bounds from tests/testing/loss_gaps.py: `log_softmax_gaps` and `log_softmax_grad_gap` for logprobs, entropies and
# the logits' gradient (each side reduces over the vocabulary in its own order; logits a side computes itself differ
# by tolerances' `matmul_gap`), `policy_loss_gaps` for a loss and its metrics from those, and the gradient weights'
# own move.


def _loss_bounds(settings, b, normalizer, lp0, h0, lp_gap, h_gap, old):
    """`policy_loss_gaps` by metric name and the loss's slope gap per token, with the kernels' per-token weights."""
    plan = plan_loss(settings, normalizer, b.mask, b.seq_ids, b.num_sequences)
    weights = {"loss": plan.weight, "metric": plan.metric_weight, "token": plan.token_weight}
    return policy_loss_gaps(lp0, old, b.ref, b.adv, weights, lp_gap, h_gap, h0, settings, K3_BOUND)


@pytest.mark.parametrize("lengths", [[3, 0, 1, 5], [0, 0], [1], [70, 2]])
def test_packing_ops(lengths):
    lengths = torch.tensor(lengths, dtype=torch.int32)
    cu = tri.cu_seqlens_from_lengths(lengths)
    assert cu.tolist() == ref_ops.cu_seqlens_from_lengths(lengths).tolist()
    assert tri.position_ids(cu).tolist() == ref_ops.position_ids(cu).tolist()
    width = int(lengths.max()) + 2
    for padded in (
        torch.randn(len(lengths), width),
        torch.randn(len(lengths), width, 3).bfloat16(),
        torch.randint(0, 1000, (len(lengths), width)),
        torch.rand(len(lengths), width) > 0.5,
    ):
        packed = tri.pack(padded, lengths)
        assert torch.equal(packed, ref_ops.pack(padded, lengths))
        pad = 0 if padded.dtype == torch.bool else 7
        assert torch.equal(tri.unpack(packed, lengths, width, pad), ref_ops.unpack(packed, lengths, width, pad))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_forward_and_backward(dtype):
    _check_token_logprobs(packed_batch(dtype=dtype, vocab=37), dtype)


def _check_token_logprobs(b, dtype):
    logits = b.logits.clone().requires_grad_()
    lp, ent = tri.token_logprobs_entropy(logits, b.targets, 0.7)
    eager_in = b.logits.clone().requires_grad_()
    lp0, ent0 = eager_logprobs(eager_in, b.targets, 0.7)
    lp_gap, h_gap = log_softmax_gaps(b.logits, b.targets, 0.7)
    assert_within(lp, lp0, lp_gap, "logprob")
    assert_within(ent, ent0, h_gap, "entropy")
    w1, w2 = torch.randn(lp.shape), torch.randn(lp.shape)
    (g,) = torch.autograd.grad((lp * w1 + ent * w2).sum(), logits)
    (g0,) = torch.autograd.grad((lp0 * w1 + ent0 * w2).sum(), eager_in)
    assert g.dtype == dtype
    assert_within(g, g0, log_softmax_grad_gap(b.logits, b.targets, w1, w2, 0.7, dtype=dtype, grad=g0), "gradient")


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_fused_loss_matches_compute_policy_loss(name):
    _check_fused_loss(SETTINGS[name], packed_batch(vocab=37))


def _check_fused_loss(settings, b):
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences, dp_world_size=2)
    logits = b.logits.clone().requires_grad_()
    loss, metrics = tri.fused_policy_loss(
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
        temperature=0.9,
    )
    (3.0 * loss).backward()
    eager_in = b.logits.clone().requires_grad_()
    lp0, ent0 = eager_logprobs(eager_in, b.targets, 0.9)
    loss0, metrics0 = oracle_loss(settings, lp0, ent0, b, normalizer)
    grad0, w1, w2 = torch.autograd.grad(3.0 * loss0, (eager_in, lp0, ent0), allow_unused=True)
    # The same logits on both sides; the gradient of 3 * loss weights each token's logprob and entropy by w1, w2
    # (each weight a few roundings of its own: 4 more terms in the sums), w1 moving along the logprob gap.
    lp_gap, h_gap = log_softmax_gaps(b.logits, b.targets, 0.9)
    value_gaps, slope_gap = _loss_bounds(settings, b, normalizer, lp0, ent0, lp_gap, h_gap, b.old)
    assert_within(loss, loss0, value_gaps["loss"], "loss")
    vocab = b.logits.shape[-1]
    bound = log_softmax_grad_gap(b.logits, b.targets, w1, w2, 0.9, [vocab, vocab, 4], w1_gap=3 * slope_gap)
    assert_within(logits.grad, grad0, bound, "logits gradient")
    assert set(metrics) == set(metrics0)
    for key in metrics0:
        assert_within(metrics[key], metrics0[key], value_gaps[key], key)


def test_fused_loss_bf16_logits_match_reference():
    settings = SETTINGS["dual_clip-seq_mean-kl_k3-entropy"]
    b = packed_batch(vocab=37, dtype=torch.bfloat16)
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences)
    outs = []
    for impl in (tri.fused_policy_loss, ref_ops.fused_policy_loss):
        logits = b.logits.clone().requires_grad_()
        loss, _ = impl(
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
        )
        loss.backward()
        outs.append((loss, logits.grad))
    # Both kernels take the same bf16 logits to float32 logprobs (`log_softmax_gaps`) and the loss (the eager
    # oracle's logprobs and weights locate the bound); each rounds its float32 gradient to bf16 once.
    lp0, ent0 = eager_logprobs(b.logits.clone().requires_grad_(), b.targets)
    loss0, _ = oracle_loss(settings, lp0, ent0, b, normalizer)
    w1, w2 = torch.autograd.grad(loss0, (lp0, ent0))
    lp_gap, h_gap = log_softmax_gaps(b.logits, b.targets)
    value_gaps, slope_gap = _loss_bounds(settings, b, normalizer, lp0, ent0, lp_gap, h_gap, b.old)
    assert_within(outs[0][0], outs[1][0], value_gaps["loss"], "loss")
    assert outs[0][1].dtype == torch.bfloat16
    vocab = b.logits.shape[-1]
    bound = log_softmax_grad_gap(b.logits, b.targets, w1, w2, 1.0, [vocab, vocab, 4], w1_gap=slope_gap,
                                 dtype=torch.bfloat16, grad=outs[1][1])
    assert_within(outs[0][1], outs[1][1], bound, "logits gradient")


def test_empty_batch():
    settings = SETTINGS["regular-token_mean"]
    b = packed_batch(lengths=[0, 0], vocab=37)
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences)
    logits = b.logits.clone().requires_grad_()
    loss, _ = tri.fused_policy_loss(settings, logits, b.targets, b.old, b.adv, b.mask, normalizer, seq_ids=b.seq_ids)
    loss.backward()
    assert float(loss.detach()) == 0.0 and logits.grad.shape == (0, 37)
    lp, _ = tri.token_logprobs_entropy(b.logits, b.targets)
    assert lp.shape == (0,)


def test_masked_vocabulary():
    logits = torch.randn(4, 10)
    logits[:, 0:6] = float("-inf")
    logits.requires_grad_()
    targets = torch.tensor([6, 7, 8, 9])
    lp, ent = tri.token_logprobs_entropy(logits, targets)
    live = logits.detach()[:, 6:].clone().requires_grad_()
    lp0, ent0 = eager_logprobs(live, targets - 6)
    torch.testing.assert_close(lp, lp0)
    torch.testing.assert_close(ent, ent0)
    (grad,) = torch.autograd.grad((lp + ent).sum(), logits)
    (grad0,) = torch.autograd.grad((lp0 + ent0).sum(), live)
    assert torch.equal(grad[:, :6], torch.zeros(4, 6))
    torch.testing.assert_close(grad[:, 6:], grad0)


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("on_policy", [False, True])
def test_chunked_loss_through_triton_kernels_matches_compute_policy_loss(name, on_policy):
    """The dispatch's chunked path with Triton's fused loss on each chunk (the GPU path) against eager logits."""
    from rl.kernels import ops

    settings = SETTINGS[name]
    b = packed_batch(vocab=37)
    g = torch.Generator().manual_seed(3)
    hidden0, weight0 = torch.randn(b.targets.numel(), 8, generator=g), torch.randn(37, 8, generator=g)
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences)
    old = None if on_policy else b.old
    hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
    loss, metrics = ops.chunked_policy_loss(
        settings, hidden, weight, b.targets, old, b.adv, b.mask, normalizer, kernels="triton",
        ref_logprobs=b.ref, seq_ids=b.seq_ids, num_sequences=b.num_sequences, temperature=0.9, chunk_size=4,
    )
    loss.backward()
    eager_h, eager_w = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
    logits0 = eager_h @ eager_w.T
    lp0, ent0 = eager_logprobs(logits0, b.targets, 0.9)
    loss0, metrics0 = compute_policy_loss(
        settings, lp0, old, b.adv, b.mask, normalizer, ref_logprobs=b.ref,
        entropy=ent0 if settings.use_entropy_loss else None, seq_ids=b.seq_ids, num_sequences=b.num_sequences,
    )
    grad_h0, grad_w0, logits_grad, w1, w2 = torch.autograd.grad(loss0, (eager_h, eager_w, logits0, lp0, ent0),
                                                                allow_unused=True)
    # Each side computes its chunks' logits (`matmul_gap` over the hidden size), their logprobs and entropies, the
    # loss and metrics over the tokens; the logits' gradient (each weight a few roundings: 4 more terms), then
    # hidden's over the vocabulary and weight's over the tokens (`matmul_gap`).
    logit_gap = matmul_gap(hidden0, weight0.T)
    lp_gap, h_gap = log_softmax_gaps(logits0, b.targets, 0.9, logit_gap)
    value_gaps, slope_gap = _loss_bounds(settings, b, normalizer, lp0, ent0, lp_gap, h_gap, old)
    assert_within(loss, loss0, value_gaps["loss"], "loss")
    grad_gap = log_softmax_grad_gap(logits0, b.targets, w1, w2, 0.9, [37, 37, 4], logit_gap, slope_gap)
    assert_within(hidden.grad, grad_h0, matmul_gap(logits_grad, weight0, grad_gap), "hidden gradient")
    assert_within(weight.grad, grad_w0, matmul_gap(logits_grad.T, hidden0, grad_gap.T), "weight gradient")
    assert set(metrics) == set(metrics0)
    for key in metrics0:
        assert_within(metrics[key], metrics0[key], value_gaps[key], key)


WIDE_VOCAB = 40_000
"""More than twice the widest block a launch record may hold (16,384), and a multiple of none."""


def _spied_record(tmp_path, monkeypatch, kernels: dict, spied: list[str]) -> dict[str, LaunchSpy]:
    """Points the kernels at a launch record for this CPU holding `kernels`, and spies on the `spied` kernels."""
    path = tmp_path / f"launches-{len(list(tmp_path.iterdir()))}.json"
    launches.save(path, "cpu", {}, kernels)
    monkeypatch.setenv(RECORD_ENV, str(path))
    spies = {name: LaunchSpy(getattr(tri, name)) for name in spied}
    for name, spy in spies.items():
        monkeypatch.setattr(tri, name, spy)
    return spies


@pytest.mark.parametrize("block", sorted({c["BLOCK_V"] for c in candidate_launches("logprobs_fwd", WIDE_VOCAB)}))
def test_every_recordable_row_block_matches_the_oracle(block, tmp_path, monkeypatch):
    """Each vocabulary block a record may hold, taken from a record by the three row kernels, over rows several
    blocks wide with a partial last block: logprobs, entropies, the loss and the gradients within their bounds."""
    launch = {"BLOCK_V": block, "num_warps": 16}
    spies = _spied_record(tmp_path, monkeypatch, {kernel: {"65536": launch} for kernel in ROW_KERNELS},
                          ["logprobs_fwd_kernel", "logprobs_bwd_kernel", "fused_loss_kernel"])
    b = packed_batch(lengths=[3, 2], vocab=WIDE_VOCAB)
    _check_token_logprobs(b, torch.float32)
    _check_fused_loss(SETTINGS["dual_clip-seq_mean-kl_k3-entropy"], b)
    assert {name: spy.launches for name, spy in spies.items()} == {
        "logprobs_fwd_kernel": [launch], "logprobs_bwd_kernel": [launch], "fused_loss_kernel": [launch]}
    # a launch given outright (the tuner's) wins over the record's; the loss also runs without a reference
    given = {"BLOCK_V": block, "num_warps": 4}
    lp, ent, lse = tri.logprobs_forward(b.logits, b.targets, 1.0, launch=given)
    tri.logprobs_backward(b.logits, b.targets, 1.0, lse, ent, torch.ones_like(lp), torch.ones_like(lp), launch=given)
    settings = SETTINGS["regular-token_mean"]
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences)
    plan = plan_loss(settings, normalizer, b.mask, b.seq_ids, b.num_sequences)
    tri.loss_forward(b.logits, b.targets, b.old, b.adv, None, plan, 1.0, launch=given)
    assert [spy.launches[-1] for spy in spies.values()] == [given] * 3


def test_every_recordable_packing_block_copies_exactly(tmp_path, monkeypatch):
    """Each (positions, features) block a record may hold for rows of 300 features, taken from a record by pack
    and unpack over sequences up to 150 positions (partial blocks of both): the same bits as the reference."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([150, 0, 37, 129], dtype=torch.int32)
    padded = torch.randn(4, 150, 300, generator=g).bfloat16()
    packed = ref_ops.pack(padded, lengths)
    blocks = sorted({(c["BLOCK_T"], c["BLOCK_D"]) for c in candidate_launches("pack", 300)})
    assert len(blocks) == 20
    for rows, features in blocks:
        launch = {"BLOCK_T": rows, "BLOCK_D": features, "num_warps": 8}
        spies = _spied_record(tmp_path, monkeypatch, {kernel: {"512": launch} for kernel in PACK_KERNELS},
                              ["pack_kernel", "unpack_kernel"])
        assert torch.equal(tri.pack(padded, lengths), packed), launch
        assert torch.equal(tri.unpack(packed, lengths, 150, 7), ref_ops.unpack(packed, lengths, 150, 7)), launch
        assert [spy.launches for spy in spies.values()] == [[launch], [launch]]
        given = {**launch, "num_warps": 4}  # a launch given outright (the tuner's) wins over the record's
        assert torch.equal(tri.pack(padded, lengths, launch=given), packed)
        assert torch.equal(tri.unpack(packed, lengths, 150, 7, launch=given), ref_ops.unpack(packed, lengths, 150, 7))
        assert [spy.launches[-1] for spy in spies.values()] == [given, given]


def test_an_on_policy_chunk_takes_its_old_logprobs_from_its_own_row_pass(tmp_path, monkeypatch):
    """Without old logprobs the fused loss kernel uses each row's own logprob, detached: no separate logprob pass
    over a chunk's logits, and a ratio of exactly 1 (ppo_kl and the clip fraction exactly 0) even where the record
    gives the logprob kernel another block than the loss kernel, whose sums would round differently."""
    from rl.kernels import ops

    spies = _spied_record(tmp_path, monkeypatch, {
        "logprobs_fwd": {"65536": {"BLOCK_V": 1024, "num_warps": 4}},
        "fused_loss": {"65536": {"BLOCK_V": 16384, "num_warps": 4}},
    }, ["logprobs_fwd_kernel", "fused_loss_kernel"])
    settings = SETTINGS["dual_clip-seq_mean-kl_k3-entropy"]
    b = packed_batch(lengths=[30, 20], vocab=WIDE_VOCAB)
    g = torch.Generator().manual_seed(5)
    # logits of about unit spread: many terms in each softmax sum, so the two blocks' logprobs differ in the last
    # bit on some rows (6 of these 50 here)
    hidden, weight = torch.randn(50, 8, generator=g) * 0.3, torch.randn(WIDE_VOCAB, 8, generator=g)
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences)
    _, metrics = ops.chunked_policy_loss(
        settings, hidden.requires_grad_(), weight, b.targets, None, b.adv, b.mask, normalizer, kernels="triton",
        ref_logprobs=b.ref, seq_ids=b.seq_ids, num_sequences=b.num_sequences, chunk_size=32,
    )
    assert spies["logprobs_fwd_kernel"].launches == []
    assert spies["fused_loss_kernel"].launches == [{"BLOCK_V": 16384, "num_warps": 4}] * 2  # chunks of 32 and 18
    assert float(metrics["ppo_kl"]) == 0.0 and float(metrics["pg_clipfrac"]) == 0.0
    assert float(metrics["pg_clipfrac_lower"]) == 0.0
