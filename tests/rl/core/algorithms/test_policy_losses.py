"""Policy losses against hand-computed values, hand-derived gradients and a naive per-token Python reference."""

import math

import pytest
import torch

from rl.core.algorithms import POLICY_LOSSES

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
    assert POLICY_LOSSES.names() == ["cispo", "dual_clip", "gspo", "regular"]
