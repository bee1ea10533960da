"""Policy losses against hand-computed values, hand-derived gradients and a naive per-token Python reference."""

import math

import pytest
import torch

from rl.core.algorithms import POLICY_LOSSES
from tests.testing.tolerances import assert_within, gamma

F64 = torch.float64
# ratios r = exp(logp - old) and advantages of five tokens (old = 0, so logp = log r)
RATIOS = [1.5, 0.5, 0.5, 1.1, 5.0]
ADVANTAGES = torch.tensor([1.0, 1.0, -2.0, -1.0, -1.0], dtype=F64)
CLIP = {"eps_clip_low": 0.2, "eps_clip_high": 0.3, "clip_ratio_c": 3.0}


def leaf_logprob():
    return torch.tensor([math.log(r) for r in RATIOS], dtype=F64, requires_grad=True)


def test_regular_hand_computed():
    # clip range [0.8, 1.3]; loss = max(-A r, -A clip(r))
    # 1: max(-1.5, -1.3) = -1.3 (clipped)  2: max(-0.5, -0.8) = -0.5   3: max(1.0, 1.6) = 1.6 (clipped)
    # 4: max(1.1, 1.1) = 1.1               5: max(5.0, 1.3) = 5.0
    logp = leaf_logprob()
    loss, metrics = POLICY_LOSSES.get("regular")(logp, torch.zeros(5, dtype=F64), ADVANTAGES, None, **CLIP)
    torch.testing.assert_close(loss, torch.tensor([-1.3, -0.5, 1.6, 1.1, 5.0], dtype=F64))
    torch.testing.assert_close(metrics["pg_clipfrac"], torch.tensor([1.0, 0, 1, 0, 0], dtype=F64))
    # d/dlogp of -A r is -A r on unclipped tokens, 0 on clipped ones
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -0.5, 0.0, 1.1, 5.0], dtype=F64))


def test_dual_clip_hand_computed():
    # as regular, then for A < 0: min(loss, -A * 3): token 3 min(1.6, 6) = 1.6, 4 min(1.1, 3), 5 min(5, 3) = 3
    logp = leaf_logprob()
    loss, metrics = POLICY_LOSSES.get("dual_clip")(logp, torch.zeros(5, dtype=F64), ADVANTAGES, None, **CLIP)
    torch.testing.assert_close(loss, torch.tensor([-1.3, -0.5, 1.6, 1.1, 3.0], dtype=F64))
    torch.testing.assert_close(metrics["pg_clipfrac_lower"], torch.tensor([0.0, 0, 0, 0, 1], dtype=F64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -0.5, 0.0, 1.1, 0.0], dtype=F64))


def test_dual_clip_needs_clip_ratio_c_above_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        POLICY_LOSSES.get("dual_clip")(
            torch.zeros(2), torch.zeros(2), torch.ones(2), None, eps_clip_low=0.2, eps_clip_high=0.2, clip_ratio_c=1.0
        )


def naive_regular(ratio, advantage, low, high, cap=None):
    loss = max(-advantage * ratio, -advantage * min(max(ratio, 1 - low), 1 + high))
    if cap is not None and advantage < 0:
        loss = min(loss, -advantage * cap)
    return loss


@pytest.mark.parametrize("name", ["regular", "dual_clip"])
def test_ppo_losses_match_naive_token_loop(name):
    gen = torch.Generator().manual_seed(3)
    logp = torch.randn(50, generator=gen, dtype=F64)
    old = logp + 0.5 * torch.randn(50, generator=gen, dtype=F64)
    adv = torch.randn(50, generator=gen, dtype=F64)
    loss, _ = POLICY_LOSSES.get(name)(logp, old, adv, None, eps_clip_low=0.2, eps_clip_high=0.28, clip_ratio_c=3.0)
    cap = 3.0 if name == "dual_clip" else None
    want = [
        naive_regular(math.exp(a - b), c, 0.2, 0.28, cap)
        for a, b, c in zip(logp.tolist(), old.tolist(), adv.tolist(), strict=True)
    ]
    torch.testing.assert_close(loss, torch.tensor(want, dtype=F64))


def gspo_inputs():
    # row 0: logp - old = [0.1, 0.3, pad] -> mean 0.2 -> s0 = exp(0.2) = 1.2214, A = +1
    # row 1: logp - old = [-0.1, 0, -0.2] -> mean -0.1 -> s1 = exp(-0.1) = 0.9048, A = -1
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -1.5]], dtype=F64)
    delta = torch.tensor([[0.1, 0.3, 5.0], [-0.1, 0.0, -0.2]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=F64)
    return old, delta, mask, adv


def test_gspo_hand_computed_padded():
    # clip range [0.9, 1.1]: row 0: max(-1.2214, -1.1) = -1.1 (clipped, no gradient)
    #                         row 1: max(0.9048, 0.9048) = 0.9048; d loss / d logp_t = -A * s1 = 0.9048
    old, delta, mask, adv = gspo_inputs()
    logp = (old + delta).requires_grad_(True)
    loss, metrics = POLICY_LOSSES.get("gspo")(logp, old, adv, mask, eps_clip_low=0.1, eps_clip_high=0.1)
    s1 = math.exp(-0.1)
    torch.testing.assert_close(loss[mask], torch.tensor([-1.1, -1.1, s1, s1, s1], dtype=F64))
    torch.testing.assert_close(metrics["pg_clipfrac"][mask], torch.tensor([1.0, 1, 0, 0, 0], dtype=F64))
    (loss * mask).sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [s1, s1, s1]], dtype=F64))


def test_gspo_packed_layout_matches_padded():
    old, delta, mask, adv = gspo_inputs()
    logp = old + delta
    padded, _ = POLICY_LOSSES.get("gspo")(logp, old, adv, mask, eps_clip_low=0.1, eps_clip_high=0.1)
    seq_ids = torch.tensor([0, 0, 1, 1, 1])
    flat, _ = POLICY_LOSSES.get("gspo")(
        logp[mask],
        old[mask],
        adv[mask],
        torch.ones(5, dtype=torch.bool),
        eps_clip_low=0.1,
        eps_clip_high=0.1,
        seq_ids=seq_ids,
        num_sequences=2,
    )
    torch.testing.assert_close(flat, padded[mask])


def test_cispo_hand_computed():
    # eps_high 0.2: token 1 r = 1.5 -> weight 1.2, A = 1, logp = log 1.5 -> loss = -1.2 * log 1.5, grad -1.2
    #               token 2 r = 0.5 -> weight 0.5, A = 2, logp = log 0.5 -> loss = -1.0 * log 0.5, grad -1.0
    logp = torch.tensor([math.log(1.5), math.log(0.5)], dtype=F64, requires_grad=True)
    adv = torch.tensor([1.0, 2.0], dtype=F64)
    loss, metrics = POLICY_LOSSES.get("cispo")(
        logp, torch.zeros(2, dtype=F64), adv, None, eps_clip_low=0.2, eps_clip_high=0.2
    )
    torch.testing.assert_close(loss, torch.tensor([-1.2 * math.log(1.5), -math.log(0.5)], dtype=F64))
    torch.testing.assert_close(metrics["pg_clipfrac"], torch.tensor([1.0, 0.0], dtype=F64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([-1.2, -1.0], dtype=F64))


def test_registry_names():
    assert POLICY_LOSSES.names() == [
        "cispo",
        "clip_cov",
        "dual_clip",
        "gspo",
        "importance_sampling",
        "kl_cov",
        "regular",
        "rollout_is",
        "sapo",
    ]


def assert_hand(got, want, ops=16, scale=None):
    """float64 both sides, each at most `ops` roundings (u relative to the magnitudes met, `scale`, default |want|)
    from the exact value: Higham's gamma_ops bounds each side's error, so they differ by <= 2 * gamma_ops * scale."""
    want = torch.as_tensor(want, dtype=F64)
    scale = want.abs() if scale is None else torch.as_tensor(scale, dtype=F64)
    assert_within(got, want, 2 * gamma(ops, F64) * scale)


def test_sapo_hand_computed():
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau_pos 1 where A > 0, tau_neg 2 elsewhere; loss -f(r) A;
    # d loss / d logp = -A * 4 s (1 - s) * r, s = sigmoid(tau (r - 1))
    # 1: r 1, A 1:    f = 2           loss -2            grad -1
    # 2: r 1, A -1:   f = 4 / 4 = 1   loss 1             grad 1
    # 3: r 2, A 0.5:  f = 4 s(1)      loss -2 s(1)       grad -4 s(1) (1 - s(1))
    # 4: r 0.5, A 0:  loss 0, grad 0
    # 5: log r = 25, clamped to 20: s = 1, f = 4, loss -4, grad 0 (beyond the clamp)
    s1 = 1.0 / (1.0 + math.exp(-1.0))
    logp = torch.tensor([0.0, 0.0, math.log(2.0), math.log(0.5), 25.0], dtype=F64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 0.5, 0.0, 1.0], dtype=F64)
    loss, _ = POLICY_LOSSES.get("sapo")(logp, torch.zeros(5, dtype=F64), adv, None, **CLIP, tau_pos=1.0, tau_neg=2.0)
    assert_hand(loss, [-2.0, 1.0, -2.0 * s1, 0.0, -4.0], scale=4.0)
    loss.sum().backward()
    assert_hand(logp.grad, [-1.0, 1.0, -4.0 * s1 * (1.0 - s1), 0.0, 0.0], scale=4.0)


def clip_cov_inputs(first_ratio=1.0):
    # five loss tokens and a padding token with wild values; masked means: A 0, logp -1
    # cov = (A - 0) * (logp + 1) = [2, -2, -2, 2, 0]: tokens 0 and 3 lie in (1, 5)
    logp = torch.tensor([0.0, -2.0, 0.0, -2.0, -1.0, 50.0], dtype=F64)
    old = logp.clone()
    old[0] -= math.log(first_ratio)
    adv = torch.tensor([2.0, 2.0, -2.0, -2.0, 0.0, 100.0], dtype=F64)
    mask = torch.tensor([True] * 5 + [False])
    return logp.requires_grad_(True), old, adv, mask


def run_clip_cov(first_ratio=1.0, **options):
    logp, old, adv, mask = clip_cov_inputs(first_ratio)
    loss, metrics = POLICY_LOSSES.get("clip_cov")(logp, old, adv, mask, eps_clip_low=0.2, eps_clip_high=0.2, **options)
    (loss * mask).sum().backward()
    return loss[mask].detach(), logp.grad[mask], metrics["clip_cov_frac"][mask], metrics["pg_clipfrac"][mask]


def test_clip_cov_cuts_the_gradient_of_tokens_with_covariance_in_the_band():
    # ratio 1: loss -A, grad -A; int(0.4 * 5) = 2 tokens may be cut and exactly two are candidates: 0 and 3
    loss, grad, cut, clipped = run_clip_cov(clip_cov_ratio=0.4, clip_cov_lb=1.0, clip_cov_ub=5.0)
    assert_hand(loss, [0.0, -2.0, 2.0, 0.0, 0.0])
    assert_hand(grad, [0.0, -2.0, 2.0, 0.0, 0.0])
    assert cut.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0] and clipped.tolist() == [0.0] * 5
    # the band is open: covariance 2 is not below an upper bound of 2
    loss, _, cut, _ = run_clip_cov(clip_cov_ratio=0.4, clip_cov_lb=1.0, clip_cov_ub=2.0)
    assert_hand(loss, [-2.0, -2.0, 2.0, 2.0, 0.0])
    assert cut.sum() == 0


def test_clip_cov_leaves_tokens_the_ppo_clip_took_and_draws_at_most_its_share():
    # token 0 at r = 1.5 > 1.2 with A = 2 is clipped by PPO (loss -2.4, no gradient), so only token 3 is cut
    loss, grad, cut, clipped = run_clip_cov(first_ratio=1.5, clip_cov_ratio=0.4)
    assert_hand(loss, [-2.4, -2.0, 2.0, 0.0, 0.0])
    assert_hand(grad, [0.0, -2.0, 2.0, 0.0, 0.0])
    assert cut.tolist() == [0.0, 0.0, 0.0, 1.0, 0.0] and clipped.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    # int(0.2 * 5) = 1: one of the two candidates, drawn at random
    torch.manual_seed(0)
    loss, _, cut, _ = run_clip_cov(clip_cov_ratio=0.2)
    assert cut.sum() == 1 and (cut[0] + cut[3]) == 1
    assert_hand(loss, torch.where(cut.bool(), 0.0, torch.tensor([-2.0, -2.0, 2.0, 2.0, 0.0], dtype=F64)))


def kl_cov_inputs():
    # four loss tokens and a padding token; masked means: A 0, logp -1 -> cov = A * (logp + 1) = [3, 0.5, 0, 4.5]
    delta = torch.tensor([0.1, -0.2, 0.3, -0.4, 0.0], dtype=F64)  # logp - old
    logp = torch.tensor([0.0, -0.5, -1.0, -2.5, 10.0], dtype=F64)
    adv = torch.tensor([3.0, 1.0, -1.0, -3.0, 50.0], dtype=F64)
    mask = torch.tensor([True] * 4 + [False])
    return logp.requires_grad_(True), logp.detach() - delta, adv, mask


def test_kl_cov_penalizes_the_tokens_of_largest_covariance():
    # int(4 * 0.5) = 2 tokens of largest covariance: 3 (4.5) and 0 (3); loss -A r + 2 |logp - old| on them,
    # grad -A r + 2 sign(logp - old)
    logp, old, adv, mask = kl_cov_inputs()
    loss, metrics = POLICY_LOSSES.get("kl_cov")(
        logp, old, adv, mask, eps_clip_low=0.2, eps_clip_high=0.2, kl_cov_frac=0.5, ppo_kl_coef=2.0
    )
    e = math.exp
    assert_hand(loss[mask], [-3 * e(0.1) + 0.2, -e(-0.2), e(0.3), 3 * e(-0.4) + 0.8], scale=4.0)
    assert metrics["kl_cov_frac"][mask].tolist() == [1.0, 0.0, 0.0, 1.0]
    (loss * mask).sum().backward()
    assert_hand(logp.grad[mask], [-3 * e(0.1) + 2, -e(-0.2), e(0.3), 3 * e(-0.4) - 2], scale=4.0)
    # int(4 * 0.2) = 0, raised to the one token of largest covariance
    loss, metrics = POLICY_LOSSES.get("kl_cov")(
        logp, old, adv, mask, eps_clip_low=0.2, eps_clip_high=0.2, kl_cov_frac=0.2, ppo_kl_coef=2.0
    )
    assert metrics["kl_cov_frac"][mask].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert_hand(loss[mask][0], -3 * e(0.1), scale=4.0)


def test_covariance_losses_without_loss_tokens_cut_nothing():
    x = torch.zeros(3, dtype=F64)
    mask = torch.zeros(3, dtype=torch.bool)
    for name in ("clip_cov", "kl_cov"):
        loss, metrics = POLICY_LOSSES.get(name)(x, x, x + 1, mask, eps_clip_low=0.2, eps_clip_high=0.2)
        assert torch.equal(loss, -torch.ones(3, dtype=F64)) and metrics[f"{name}_frac"].sum() == 0


def test_importance_sampling_hand_computed():
    # loss -r A with r unclipped and differentiated: d/dlogp (-r A) = -r A
    logp = torch.tensor([math.log(1.5), math.log(5.0), 0.0], dtype=F64, requires_grad=True)
    adv = torch.tensor([2.0, -1.0, 0.7], dtype=F64)
    loss, metrics = POLICY_LOSSES.get("importance_sampling")(logp, torch.zeros(3, dtype=F64), adv, None, **CLIP)
    assert_hand(loss, [-3.0, 5.0, -0.7])
    assert_hand(metrics["importance_ratio"], [1.5, 5.0, 1.0])
    loss.sum().backward()
    assert_hand(logp.grad, [-3.0, 5.0, -0.7])


def test_rollout_is_hand_computed():
    # band (1 - 0.2, 1 + 0.3) = (0.8, 1.3); loss -sg(r in band ? r : 0) A logp, so d/dlogp = -(r in band ? r : 0) A
    # 1: r 1.1, A 1    inside:  loss -1.1 log 1.1,      grad -1.1
    # 2: r 0.9, A -2   inside:  loss  1.8 log 0.9,      grad  1.8
    # 3: r 1.5, A 1    above:   loss 0, grad 0 (cispo would clamp its weight to 1.3)
    # 4: r 0.5, A 3    below:   loss 0, grad 0
    # 5: r 1, A 1      inside:  loss 0 (log 1),         grad -1
    ratios = [1.1, 0.9, 1.5, 0.5, 1.0]
    logp = torch.tensor([math.log(r) for r in ratios], dtype=F64, requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 1.0, 3.0, 1.0], dtype=F64)
    loss, metrics = POLICY_LOSSES.get("rollout_is")(logp, torch.zeros(5, dtype=F64), adv, None, **CLIP)
    assert_hand(loss, [-1.1 * math.log(1.1), 1.8 * math.log(0.9), 0.0, 0.0, 0.0])
    assert metrics["pg_clipfrac"].tolist() == [0.0, 0.0, 1.0, 1.0, 0.0]
    loss.sum().backward()
    assert_hand(logp.grad, [-1.1, 1.8, 0.0, 0.0, -1.0])
