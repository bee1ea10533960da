"""Trainer-vs-rollout mismatch metrics and the off-policy corrections against hand-computed values (r = exp(old -
rollout) per loss token), SkyRL's order of the corrections, and the property the trainer relies on to apply TIS
weights through the advantages: every registered policy loss but the covariance ones (refused with TIS) is linear,
with a non-negative factor, in each token's advantage."""

import math
from types import SimpleNamespace

import pytest
import torch

from rl.core.algorithms import POLICY_LOSSES
from rl.core.algorithms.off_policy import correct, correction_enabled, mismatch_metrics
from rl.core.algorithms.policy_loss import COVARIANCE_LOSSES


def _config(**over):
    values = dict(tis_ratio_type=None, token_tis_ratio_clip_high=2.0, sequence_tis_ratio_clip_high=5.0,
                  sequence_mask_metric=None, geo_mask_high=1.01, geo_mask_low=0.99, product_mask_high=2.0,
                  product_mask_low=0.5, outlier_token_is_threshold_low=None, outlier_token_is_threshold_high=None,
                  token_mask_is_threshold_low=None, token_mask_is_threshold_high=None)
    return SimpleNamespace(**{**values, **over})


# two sequences: [prompt, 3 loss tokens] and [prompt, 2 loss tokens]; log ratios old - rollout below
LOG_RATIO = torch.tensor([0.0, 0.5, -0.5, 1.0, 0.0, 0.2, -0.1])
MASK = torch.tensor([False, True, True, True, False, True, True])
SEQ_IDS = torch.tensor([0, 0, 0, 0, 1, 1, 1])
OLD = torch.full((7,), -1.0)
ROLLOUT = OLD - LOG_RATIO


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(OLD, ROLLOUT, MASK)
    d = [0.5, -0.5, 1.0, 0.2, -0.1]
    r = [math.exp(x) for x in d]
    assert m["rollout_logprob_abs_diff_mean"] == pytest.approx(sum(abs(x) for x in d) / 5)
    assert m["rollout_logprob_abs_diff_max"] == pytest.approx(1.0)
    assert m["rollout_kl_k3"] == pytest.approx(sum(ri - 1 - x for ri, x in zip(r, d, strict=True)) / 5)
    assert m["rollout_is_ess"] == pytest.approx(sum(r) ** 2 / (5 * sum(ri * ri for ri in r)))
    assert mismatch_metrics(OLD, OLD, MASK)["rollout_is_ess"] == pytest.approx(1.0)
    assert mismatch_metrics(OLD, ROLLOUT, torch.zeros(7, dtype=torch.bool)) == {}


def test_off_by_default_changes_nothing():
    assert not correction_enabled(_config())
    weight, mask, metrics = correct(_config(), OLD, ROLLOUT, MASK, SEQ_IDS, 2)
    assert torch.equal(weight, torch.ones(7)) and torch.equal(mask, MASK) and metrics == {}
    assert not correction_enabled(_config(token_mask_is_threshold_low=0.5))  # one bound alone does nothing
    assert correction_enabled(_config(outlier_token_is_threshold_high=10.0))


def test_token_tis_caps_each_ratio():
    weight, mask, metrics = correct(_config(tis_ratio_type="token", token_tis_ratio_clip_high=2.0),
                                    OLD, ROLLOUT, MASK, SEQ_IDS, 2)
    want = [0.0, math.exp(0.5), math.exp(-0.5), 2.0, 0.0, math.exp(0.2), math.exp(-0.1)]  # e^1 = 2.718 -> 2.0
    torch.testing.assert_close(weight, torch.tensor(want))
    assert torch.equal(mask, MASK)
    assert metrics["tis_token_clip_high_ratio"] == pytest.approx(1 / 5)


def test_sequence_tis_weights_whole_sequences_by_the_capped_product():
    weight, _, metrics = correct(_config(tis_ratio_type="sequence", sequence_tis_ratio_clip_high=2.0),
                                 OLD, ROLLOUT, MASK, SEQ_IDS, 2)
    first, second = min(math.exp(0.5 - 0.5 + 1.0), 2.0), math.exp(0.2 - 0.1)  # e^1 capped at 2; e^0.1
    torch.testing.assert_close(weight, torch.tensor([0.0, first, first, first, 0.0, second, second]))
    assert metrics["tis_seq_clip_high_ratio"] == pytest.approx(1 / 2)


def test_geometric_mask_rejects_sequences_outside_the_band():
    # geometric means: exp(1/3) = 1.40 (out of [0.9, 1.1]) and exp(0.05) = 1.05 (in)
    weight, mask, metrics = correct(_config(sequence_mask_metric="geometric", geo_mask_low=0.9, geo_mask_high=1.1),
                                    OLD, ROLLOUT, MASK, SEQ_IDS, 2)
    assert mask.tolist() == [False, False, False, False, False, True, True]
    assert weight.tolist() == mask.float().tolist()  # no TIS: weight 1 where kept
    assert metrics["geo_sequence_mask_masked_ratio"] == 0.5
    assert metrics["geo_sequence_mask_over_high_ratio"] == 0.5 and metrics["geo_sequence_mask_under_low_ratio"] == 0


def test_product_mask_and_token_tis_together():
    # products e^1 = 2.72 (> 2: rejected) and e^0.1 = 1.11 (kept); TIS weights only where kept
    weight, mask, metrics = correct(_config(sequence_mask_metric="product", tis_ratio_type="token"),
                                    OLD, ROLLOUT, MASK, SEQ_IDS, 2)
    assert mask.tolist() == [False] * 5 + [True, True]
    torch.testing.assert_close(weight, torch.tensor([0, 0, 0, 0, 0, math.exp(0.2), math.exp(-0.1)]))
    assert metrics["product_sequence_mask_masked_ratio"] == 0.5


def test_outlier_tokens_reject_their_sequence_and_token_mask_rejects_single_tokens():
    _, mask, metrics = correct(_config(outlier_token_is_threshold_low=0.7), OLD, ROLLOUT, MASK, SEQ_IDS, 2)
    assert mask.tolist() == [False] * 5 + [True, True]  # e^-0.5 = 0.61 < 0.7 in the first sequence
    assert metrics["outlier_seq_masked_ratio"] == 0.5 and metrics["outlier_seq_under_low_ratio"] == 0.5
    _, mask, metrics = correct(_config(token_mask_is_threshold_low=0.7, token_mask_is_threshold_high=2.0),
                               OLD, ROLLOUT, MASK, SEQ_IDS, 2)
    assert mask.tolist() == [False, True, False, False, False, True, True]  # 0.61 and 2.72 leave
    assert metrics["token_mask_masked_ratio"] == pytest.approx(2 / 5)


def test_token_mask_comes_before_sequence_tis():
    # SkyRL's order: the token mask [0.7, 2] drops e^-0.5 = 0.61 and e^1 = 2.72 from the first sequence, so its TIS
    # product is e^0.5 over the one token left (with the old order, TIS first, it was e^(0.5 - 0.5 + 1) = e^1)
    config = _config(tis_ratio_type="sequence", sequence_tis_ratio_clip_high=5.0, token_mask_is_threshold_low=0.7,
                     token_mask_is_threshold_high=2.0)
    weight, mask, metrics = correct(config, OLD, ROLLOUT, MASK, SEQ_IDS, 2)
    assert mask.tolist() == [False, True, False, False, False, True, True]
    first, second = math.exp(0.5), math.exp(0.2 - 0.1)
    torch.testing.assert_close(weight, torch.tensor([0.0, first, 0.0, 0.0, 0.0, second, second]))
    assert metrics["token_mask_masked_ratio"] == pytest.approx(2 / 5)


def test_token_mask_comes_before_the_sequence_mask():
    # after the token mask the first sequence's geometric mean is e^(0.5 / 1) = 1.65, outside [0.9, 1.5], so the
    # sequence leaves (with the old order, the sequence mask first, it was e^(1 / 3) = 1.40 and stayed)
    config = _config(sequence_mask_metric="geometric", geo_mask_low=0.9, geo_mask_high=1.5,
                     token_mask_is_threshold_low=0.7, token_mask_is_threshold_high=2.0)
    weight, mask, metrics = correct(config, OLD, ROLLOUT, MASK, SEQ_IDS, 2)
    assert mask.tolist() == [False] * 5 + [True, True]
    assert weight.tolist() == mask.float().tolist()
    assert metrics["geo_sequence_mask_masked_ratio"] == 0.5


def test_outlier_sequences_come_before_the_token_mask():
    # the outlier bound rejects the first sequence (e^-0.5 < 0.7) before the token mask counts its tokens
    config = _config(outlier_token_is_threshold_low=0.7, token_mask_is_threshold_low=0.95,
                     token_mask_is_threshold_high=2.0)
    _, mask, metrics = correct(config, OLD, ROLLOUT, MASK, SEQ_IDS, 2)
    assert mask.tolist() == [False] * 5 + [True, False]  # e^0.2 = 1.22 stays, e^-0.1 = 0.905 < 0.95 leaves
    assert metrics["token_mask_masked_ratio"] == pytest.approx(1 / 2)  # of the two tokens left, not of five


LINEAR_LOSSES = [name for name in POLICY_LOSSES.names() if name not in COVARIANCE_LOSSES]


@pytest.mark.parametrize("name", LINEAR_LOSSES)
def test_scaling_a_tokens_advantage_scales_its_policy_loss(name):
    g = torch.Generator().manual_seed(0)
    lp, old = -torch.rand(12, generator=g) * 3, -torch.rand(12, generator=g) * 3
    adv, w = torch.randn(12, generator=g), torch.rand(12, generator=g) * 3
    seq_ids, mask = torch.arange(12) // 4, torch.ones(12, dtype=torch.bool)
    kwargs = dict(eps_clip_low=0.2, eps_clip_high=0.28, clip_ratio_c=3.0, seq_ids=seq_ids, num_sequences=3)
    fn = POLICY_LOSSES.get(name)
    scaled, _ = fn(lp, old, adv * w, mask, **kwargs)
    plain, _ = fn(lp, old, adv, mask, **kwargs)
    torch.testing.assert_close(scaled, plain * w)
