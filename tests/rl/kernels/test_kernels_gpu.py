"""GPU: the CUDA and Triton kernels at real sizes against the torch reference and eager oracles (tags=["gpu"])."""

import pytest
import torch

from rl.kernels import reference as ref_ops
from tests.rl.kernels.cases import SETTINGS, eager_logprobs, oracle_loss, packed_batch
from tests.testing.tolerances import assert_within, network_rtol, rounded_gap

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def _impl(name):
    if name == "cuda":
        from rl.kernels.cuda import ext
        from rl.kernels.cuda.loader import load

        if load() is None:
            pytest.fail("rl_kernels_cuda.so is not built: bazel build //rl/kernels/cuda:rl_kernels_cuda.so")
        return ext
    from rl.kernels.triton import ops

    return ops


IMPLS = ["cuda", "triton"]


def _lengths(batch: int, width: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (batch,), generator=g, dtype=torch.int32)
    lengths[:4] = torch.tensor([0, 1, width, 1], dtype=torch.int32)
    return lengths.cuda()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_packing_at_scale(impl, dtype):
    ops = _impl(impl)
    lengths = _lengths(300, 2048, 0)
    cu = ops.cu_seqlens_from_lengths(lengths)
    torch.testing.assert_close(cu, ref_ops.cu_seqlens_from_lengths(lengths), rtol=0, atol=0)
    assert torch.equal(ops.position_ids(cu), ref_ops.position_ids(cu))
    padded = (torch.randn(300, 2048, device="cuda") * 100).to(dtype)
    packed = ops.pack(padded, lengths)
    assert torch.equal(packed, ref_ops.pack(padded, lengths))
    assert torch.equal(ops.unpack(packed, lengths, 2048, 0), ref_ops.unpack(packed, lengths, 2048, 0))
    feats = torch.randn(300, 64, 24, device="cuda").to(dtype)
    small = lengths.clamp(max=64)
    assert torch.equal(ops.pack(feats, small), ref_ops.pack(feats, small))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_at_scale(impl, dtype):
    ops = _impl(impl)
    g = torch.Generator(device="cuda").manual_seed(0)
    n, vocab = 4096, 32768
    logits = (torch.randn(n, vocab, device="cuda", generator=g) * 3).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    lp, ent = ops.token_logprobs_entropy(logits, targets, 0.8)
    eager_in = logits.detach().clone().requires_grad_()
    lp0, ent0 = eager_logprobs(eager_in, targets, 0.8)
    torch.testing.assert_close(lp, lp0, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(ent, ent0, atol=2e-4, rtol=1e-4)
    w1, w2 = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    (grad,) = torch.autograd.grad((lp * w1 + ent * w2).sum(), logits)
    (grad0,) = torch.autograd.grad((lp0 * w1 + ent0 * w2).sum(), eager_in)
    # d/dz_j of w1 * lp + w2 * ent is (w1 (1[j = t] - p_j) - w2 p_j (log p_j + H)) / T: two reductions over the
    # vocabulary (the softmax normaliser and the entropy's sum) in each kernel's own order, so the fp32 gap is
    # network_rtol([vocab, vocab]) relative to the sum of the terms' magnitudes; a bf16 gradient is rounded once more.
    with torch.no_grad():
        logp = torch.log_softmax(logits.detach().float() / 0.8, -1)
        p, entropy = logp.exp(), ent0.detach()[:, None]
        scale = (w1.abs()[:, None] * p + w2.abs()[:, None] * p * (logp.abs() + entropy)) / 0.8
        scale[torch.arange(n, device="cuda"), targets] += w1.abs() / 0.8
        bound = network_rtol([vocab, vocab], torch.float32) * scale
        del logp, p
        if dtype != torch.float32:
            bound = rounded_gap(grad0, bound, dtype)
    assert_within(grad, grad0, bound, f"{impl} {dtype} logits gradient")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_loss_at_scale(impl, name, dtype):
    ops = _impl(impl)
    settings = SETTINGS[name]
    lengths = _lengths(64, 64, 1).tolist()
    b = packed_batch(lengths=lengths, vocab=32768, dtype=dtype, device="cuda", seed=2)
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences, dp_world_size=2)
    logits = b.logits.clone().requires_grad_()
    loss, metrics = ops.fused_policy_loss(
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
    loss.backward()
    eager_in = b.logits.clone().requires_grad_()
    lp0, ent0 = eager_logprobs(eager_in, b.targets, 0.9)
    loss0, metrics0 = oracle_loss(settings, lp0, ent0, b, normalizer)
    loss0.backward()
    torch.testing.assert_close(loss, loss0, atol=1e-4, rtol=1e-4)
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(logits.grad.float(), eager_in.grad.float(), atol=tol, rtol=1e-2)
    for key in metrics0:
        torch.testing.assert_close(metrics[key], metrics0[key], atol=1e-4, rtol=1e-4, msg=key)


def test_auto_dispatch_picks_a_gpu_kernel():
    from rl.kernels import ops

    assert ops.resolve("auto", torch.zeros(1, device="cuda")) in ("cuda", "triton")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_chunked_loss_through_gpu_kernels(impl, name):
    """The chunked path with each implementation's fused loss per chunk against eager full logits (fp32)."""
    from rl.core.algorithms import compute_policy_loss
    from rl.kernels import ops

    _impl(impl)
    settings = SETTINGS[name]
    b = packed_batch(lengths=[300, 1, 700, 0, 24], vocab=32000, device="cuda", scale=1.0)
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden0 = torch.randn(b.targets.numel(), 256, device="cuda", generator=g)
    weight0 = torch.randn(32000, 256, device="cuda", generator=g) * 0.06
    normalizer = settings.normalizer(b.mask, seq_ids=b.seq_ids, num_sequences=b.num_sequences)
    hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
    loss, _ = ops.chunked_policy_loss(settings, hidden, weight, b.targets, b.old, b.adv, b.mask, normalizer,
                                      kernels=impl, ref_logprobs=b.ref, seq_ids=b.seq_ids,
                                      num_sequences=b.num_sequences, chunk_size=256)
    loss.backward()
    eager_h, eager_w = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
    lp0, ent0 = eager_logprobs(eager_h @ eager_w.T, b.targets)
    loss0, _ = compute_policy_loss(settings, lp0, b.old, b.adv, b.mask, normalizer, ref_logprobs=b.ref,
                                   entropy=ent0 if settings.use_entropy_loss else None, seq_ids=b.seq_ids,
                                   num_sequences=b.num_sequences)
    loss0.backward()
    torch.testing.assert_close(loss, loss0, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(hidden.grad, eager_h.grad, atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(weight.grad, eager_w.grad, atol=1e-4, rtol=1e-3)
