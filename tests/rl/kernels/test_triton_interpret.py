"""Triton kernels under TRITON_INTERPRET=1 on CPU at tiny sizes, against the torch reference and eager formulas."""

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton runs on CPU only with TRITON_INTERPRET=1 (the Bazel target sets it)", allow_module_level=True)

from rl.core.algorithms import compute_policy_loss
from rl.kernels import reference as ref_ops
from rl.kernels.triton import ops as tri
from tests.rl.kernels.cases import SETTINGS, eager_logprobs, oracle_loss, packed_batch


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
    b = packed_batch(dtype=dtype, vocab=37)
    logits = b.logits.clone().requires_grad_()
    lp, ent = tri.token_logprobs_entropy(logits, b.targets, 0.7)
    eager_in = b.logits.clone().requires_grad_()
    lp0, ent0 = eager_logprobs(eager_in, b.targets, 0.7)
    torch.testing.assert_close(lp, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ent0, atol=1e-5, rtol=1e-5)
    w1, w2 = torch.randn(lp.shape), torch.randn(lp.shape)
    (g,) = torch.autograd.grad((lp * w1 + ent * w2).sum(), logits)
    (g0,) = torch.autograd.grad((lp0 * w1 + ent0 * w2).sum(), eager_in)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(g, g0, atol=tol, rtol=tol)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_fused_loss_matches_compute_policy_loss(name):
    settings = SETTINGS[name]
    b = packed_batch(vocab=37)
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
    (3.0 * loss0).backward()
    torch.testing.assert_close(loss, loss0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits.grad, eager_in.grad, atol=1e-6, rtol=1e-4)
    assert set(metrics) == set(metrics0)
    for key in metrics0:
        torch.testing.assert_close(metrics[key], metrics0[key], atol=1e-5, rtol=1e-5, msg=key)


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
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    assert outs[0][1].dtype == torch.bfloat16
    torch.testing.assert_close(outs[0][1].float(), outs[1][1].float(), atol=1e-3, rtol=1e-2)


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
    lp0, ent0 = eager_logprobs(eager_h @ eager_w.T, b.targets, 0.9)
    loss0, metrics0 = compute_policy_loss(
        settings, lp0, old, b.adv, b.mask, normalizer, ref_logprobs=b.ref,
        entropy=ent0 if settings.use_entropy_loss else None, seq_ids=b.seq_ids, num_sequences=b.num_sequences,
    )
    loss0.backward()
    torch.testing.assert_close(loss, loss0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden.grad, eager_h.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(weight.grad, eager_w.grad, atol=1e-5, rtol=1e-4)
    assert set(metrics) == set(metrics0)
    for key in metrics0:
        torch.testing.assert_close(metrics[key], metrics0[key], atol=1e-5, rtol=1e-5, msg=key)
