"""GPU: the CUDA and Triton kernels at real sizes against the torch reference and eager oracles (tags=["gpu"])."""

import pytest
import torch

from rl.core.algorithms.kl import K3_BOUND
from rl.kernels import reference as ref_ops
from rl.kernels.reference.policy_terms import plan_loss
from tests.rl.kernels.cases import SETTINGS, LaunchSpy, eager_logprobs, oracle_loss, packed_batch
from tests.testing.loss_gaps import log_softmax_gaps, log_softmax_grad_gap, policy_loss_gaps
from tests.testing.tolerances import assert_within, matmul_gap, network_rtol, rounded_gap

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

# Bounds from tests/testing/tolerances.py, as in test_triton_interpret.py: float32 arithmetic on the GPU rounds as on
# the CPU (TF32 is off: torch's default, which nothing in rl/ changes), so `log_softmax_gaps` and
# `log_softmax_grad_gap` bound logprobs, entropies and the logits' gradient (each kernel reduces over the vocabulary
# in its own order; logits a side computes itself differ by `matmul_gap`), `policy_loss_gaps` a loss and its
# metrics, and a bf16 result rounds once more on each side (`rounded_gap`, through `dtype=`).


def _loss_bounds(settings, b, normalizer, lp0, h0, lp_gap, h_gap, old):
    """`policy_loss_gaps` by metric name and the loss's slope gap per token, with the kernels' per-token weights."""
    plan = plan_loss(settings, normalizer, b.mask, b.seq_ids, b.num_sequences)
    weights = {"loss": plan.weight, "metric": plan.metric_weight, "token": plan.token_weight}
    return policy_loss_gaps(lp0, old, b.ref, b.adv, weights, lp_gap, h_gap, h0, settings, K3_BOUND)


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
    # the same (bf16 or float32) logits on both sides, each reduced over the vocabulary in float32 in its own order
    lp_gap, h_gap = log_softmax_gaps(logits.detach(), targets, 0.8)
    assert_within(lp, lp0, lp_gap, f"{impl} {dtype} logprobs")
    assert_within(ent, ent0, h_gap, f"{impl} {dtype} entropy")
    del lp_gap, h_gap
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
    grad0, w1, w2 = torch.autograd.grad(loss0, (eager_in, lp0, ent0), allow_unused=True)
    # The same logits on both sides; the loss's gradient weights each token's logprob and entropy by w1, w2 (each
    # weight a few roundings of its own: 4 more terms in the sums), w1 moving along the logprob gap; a bf16 gradient
    # rounds once more on each side.
    lp_gap, h_gap = log_softmax_gaps(b.logits, b.targets, 0.9)
    value_gaps, slope_gap = _loss_bounds(settings, b, normalizer, lp0, ent0, lp_gap, h_gap, b.old)
    assert_within(loss, loss0, value_gaps["loss"], f"{impl} {dtype} loss")
    vocab = b.logits.shape[-1]
    bound = log_softmax_grad_gap(b.logits, b.targets, w1, w2, 0.9, [vocab, vocab, 4], w1_gap=slope_gap,
                                 dtype=dtype, grad=grad0)
    assert_within(logits.grad, grad0, bound, f"{impl} {dtype} logits gradient")
    assert set(metrics) == set(metrics0)
    for key in metrics0:
        assert_within(metrics[key], metrics0[key], value_gaps[key], f"{impl} {dtype} {key}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_product_accumulates_in_fp32_on_the_gpu(dtype):
    """The chunked loss's weight-gradient accumulation: bf16 factors go through cuBLAS's fp32-output addmm into the
    same buffer; the result is the exact product of their values added to `total`, within float32 rounding of the
    K = 4096 terms (`matmul_gap`) and of the final addition."""
    from rl.kernels.autograd import add_product, fp32_out_addmm

    assert fp32_out_addmm(torch.device("cuda")), "this torch has no fp32-output addmm: add_product rounds to bf16"
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(512, 4096, device="cuda", generator=g).to(dtype)
    b = torch.randn(4096, 256, device="cuda", generator=g).to(dtype)
    start = torch.randn(512, 256, device="cuda", generator=g)
    total = start.clone()
    assert add_product(total, a, b) is total and total.dtype == torch.float32
    want = start.double() + a.double() @ b.double()
    assert_within(total, want, matmul_gap(a, b) + want.abs() * 2.0**-24, f"{dtype} factors")


def test_this_gpu_takes_the_launches_recorded_under_its_name(tmp_path, monkeypatch):
    """A record for this GPU's name (as bench/tune_kernels.py writes it) reaches the Triton kernels, and launches
    that differ from the default in warps as well as blocks (warps matter only on a GPU) give the default's bits on
    logits whose softmax sums are exact in any order (0 or -200)."""
    from bench import kernels_gpu
    from bench.tune_kernels import packing_case, row_case, same
    from rl.kernels import launches
    from rl.kernels.sizing import default_launch, device_of
    from rl.kernels.triton import ops as tri

    name = torch.cuda.get_device_name()
    here = device_of(torch.device("cuda"))
    props = torch.cuda.get_device_properties(0)
    assert (here.kind, here.name, here.sm_count, here.memory_bytes) == (
        "cuda", name, props.multi_processor_count, props.total_memory)
    row, pack = {"BLOCK_V": 2048, "num_warps": 16}, {"BLOCK_T": 16, "BLOCK_D": 256, "num_warps": 8}
    path = tmp_path / "launches.json"
    launches.save(path, name, {}, {"logprobs_fwd": {"65536": row}, "fused_loss": {"65536": row},
                                   "unpack": {"512": pack}})
    monkeypatch.setenv(launches.RECORD_ENV, str(path))
    monkeypatch.setattr(kernels_gpu, "DEVICE", "cuda")
    spies = {k: LaunchSpy(getattr(tri, k)) for k in ("logprobs_fwd_kernel", "fused_loss_kernel", "unpack_kernel")}
    for attribute, spy in spies.items():
        monkeypatch.setattr(tri, attribute, spy)
    cases = [(kernel, *row_case(kernel, 64, 40_000, exact=True), 40_000, row) for kernel in ("logprobs_fwd",
                                                                                          "fused_loss")]
    cases.append(("unpack", *packing_case("unpack", 300, 16, 150), 300, pack))
    for kernel, call, _, size, launch in cases:
        spy = spies[f"{kernel}_kernel"]
        spy.launches.clear()
        recorded = call(None)  # no launch given: the record's
        assert spy.launches == [launch], kernel
        assert same(recorded, call(default_launch(kernel, size))), kernel


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
    logits0 = eager_h @ eager_w.T
    lp0, ent0 = eager_logprobs(logits0, b.targets)
    loss0, _ = compute_policy_loss(settings, lp0, b.old, b.adv, b.mask, normalizer, ref_logprobs=b.ref,
                                   entropy=ent0 if settings.use_entropy_loss else None, seq_ids=b.seq_ids,
                                   num_sequences=b.num_sequences)
    grad_h0, grad_w0, logits_grad, w1, w2 = torch.autograd.grad(loss0, (eager_h, eager_w, logits0, lp0, ent0),
                                                                allow_unused=True)
    # Each side computes its chunks' logits (`matmul_gap` over the hidden size), their logprobs and entropies, the
    # loss over the tokens; the logits' gradient (each weight a few roundings: 4 more terms), then hidden's over the
    # vocabulary and weight's over the tokens (`matmul_gap`).
    vocab = weight0.shape[0]
    logit_gap = matmul_gap(hidden0, weight0.T)
    lp_gap, h_gap = log_softmax_gaps(logits0, b.targets, 1.0, logit_gap)
    value_gaps, slope_gap = _loss_bounds(settings, b, normalizer, lp0, ent0, lp_gap, h_gap, b.old)
    assert_within(loss, loss0, value_gaps["loss"], f"{impl} loss")
    grad_gap = log_softmax_grad_gap(logits0, b.targets, w1, w2, 1.0, [vocab, vocab, 4], logit_gap, slope_gap)
    assert_within(hidden.grad, grad_h0, matmul_gap(logits_grad, weight0, grad_gap), f"{impl} hidden gradient")
    assert_within(weight.grad, grad_w0, matmul_gap(logits_grad.T, hidden0, grad_gap.T), f"{impl} weight gradient")
