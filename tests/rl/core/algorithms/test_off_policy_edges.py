"""Off-policy corrections at their edges, by hand: the ratio clamp, bounds that a ratio sits exactly on (a log
ratio of 0 is a ratio of exactly 1), corrections with one bound of two, and the metrics' fractions."""

import math
from types import SimpleNamespace

import pytest
import torch

from rl.core.algorithms.off_policy import correct, mismatch_metrics


def config(**over):
    values = dict(tis_ratio_type=None, token_tis_ratio_clip_high=2.0, sequence_tis_ratio_clip_high=5.0,
                  sequence_mask_metric=None, geo_mask_high=1.01, geo_mask_low=0.99, product_mask_high=2.0,
                  product_mask_low=0.5, outlier_token_is_threshold_low=None, outlier_token_is_threshold_high=None,
                  token_mask_is_threshold_low=None, token_mask_is_threshold_high=None)
    return SimpleNamespace(**{**values, **over})


def run(cfg, log_ratio, seq_ids, mask=None):
    log_ratio = torch.tensor(log_ratio)
    old = torch.full(log_ratio.shape, -1.0)
    mask = torch.ones(log_ratio.shape, dtype=torch.bool) if mask is None else torch.tensor(mask)
    seq_ids = torch.tensor(seq_ids)
    return correct(cfg, old, old - log_ratio, mask, seq_ids, int(seq_ids.max()) + 1)


def test_token_weights_clamp_the_log_ratio_to_twenty():
    weight, _, _ = run(config(tis_ratio_type="token", token_tis_ratio_clip_high=1e30), [-25.0, 25.0, 0.5], [0, 1, 2])
    assert weight.tolist() == torch.exp(torch.tensor([-20.0, 20.0, 0.5])).tolist()


def test_k3_mismatch_clamps_the_log_ratio_to_twenty():
    # diff = old - rollout = +-25 counts as +-20: k3 = r - 1 - d with r = exp(d)
    old = torch.zeros(2, dtype=torch.float64)
    rollout = torch.tensor([-25.0, 25.0], dtype=torch.float64)
    got = mismatch_metrics(old, rollout, torch.ones(2, dtype=torch.bool))
    want = ((math.exp(20.0) - 1 - 20.0) + (math.exp(-20.0) - 1 + 20.0)) / 2
    assert got["rollout_kl_k3"] == pytest.approx(want, rel=1e-15)
    r = [math.exp(20.0), math.exp(-20.0)]
    assert got["rollout_is_ess"] == pytest.approx(sum(r) ** 2 / (2 * (r[0] ** 2 + r[1] ** 2)), rel=1e-15)


def test_caps_are_reached_not_exceeded_at_a_ratio_of_one():
    # cap 1 and ratio exactly 1: the weight is 1 and no token or sequence counts as clipped
    weight, _, metrics = run(config(tis_ratio_type="token", token_tis_ratio_clip_high=1.0), [0.0, 0.5], [0, 0])
    assert weight.tolist() == [1.0, 1.0] and metrics["tis_token_clip_high_ratio"] == 0.5
    weight, _, metrics = run(config(tis_ratio_type="sequence", sequence_tis_ratio_clip_high=1.0), [0.5, -0.5, 0.25],
                             [0, 0, 1])
    assert weight.tolist() == [1.0, 1.0, 1.0] and metrics["tis_seq_clip_high_ratio"] == 0.5


def test_sequence_mask_bounds_are_inclusive_and_the_fraction_counts_the_rejected():
    # geometric means exp(0) = 1 (seq 0), exp(0.5) (seq 1), exp(0) (seq 2); band [1, 1]: seq 1 alone is out
    cfg = config(sequence_mask_metric="geometric", geo_mask_low=1.0, geo_mask_high=1.0)
    _, mask, metrics = run(cfg, [0.0, 0.0, 0.5, 0.5, 0.0], [0, 0, 1, 1, 2])
    assert mask.tolist() == [True, True, False, False, True]
    assert metrics["geo_sequence_mask_masked_ratio"] == pytest.approx(1 / 3)
    assert metrics["geo_sequence_mask_over_high_ratio"] == pytest.approx(1 / 3)
    assert metrics["geo_sequence_mask_under_low_ratio"] == 0.0


def test_a_single_rejected_sequence_is_the_whole_fraction():
    _, mask, metrics = run(config(sequence_mask_metric="product", product_mask_high=1.5), [1.0, 0.0], [0, 0])
    assert mask.tolist() == [False, False] and metrics["product_sequence_mask_masked_ratio"] == 1.0


def test_outlier_sequences_with_an_upper_bound_only():
    # high 1: seq 0 has one token above (exp(0.5)) and is rejected; seq 1's ratios 1 and exp(-0.5) stay (1 is not
    # above 1); seq 2's token above the bound is outside the loss mask
    cfg = config(outlier_token_is_threshold_high=1.0)
    _, mask, metrics = run(cfg, [0.5, -0.5, 0.0, -0.5, 3.0, 0.0], [0, 0, 1, 1, 2, 2],
                           mask=[True, True, True, True, False, True])
    assert mask.tolist() == [False, False, True, True, False, True]
    assert metrics == {"outlier_seq_masked_ratio": pytest.approx(1 / 3),
                       "outlier_seq_over_high_ratio": pytest.approx(1 / 3), "outlier_seq_under_low_ratio": 0.0}


def test_outlier_sequences_with_a_lower_bound_only():
    # low 1: seq 0 has a token below (exp(-0.5)); seq 1's ratios 1 and exp(0.5) stay (1 is not below 1)
    cfg = config(outlier_token_is_threshold_low=1.0)
    _, mask, metrics = run(cfg, [0.5, -0.5, 0.0, 0.5], [0, 0, 1, 1])
    assert mask.tolist() == [False, False, True, True]
    assert metrics["outlier_seq_under_low_ratio"] == 0.5 and metrics["outlier_seq_over_high_ratio"] == 0.0


@pytest.mark.parametrize("bound", ["token_mask_is_threshold_low", "token_mask_is_threshold_high"])
def test_token_mask_needs_both_bounds(bound):
    # another correction is on (token TIS with a cap no ratio reaches); one token-mask bound alone masks nothing
    cfg = config(tis_ratio_type="token", token_tis_ratio_clip_high=100.0, **{bound: 1.0})
    _, mask, metrics = run(cfg, [0.5, -0.5], [0, 0])
    assert mask.tolist() == [True, True] and "token_mask_masked_ratio" not in metrics


def test_token_mask_bounds_are_inclusive():
    for low, high in ((1.0, 2.0), (0.5, 1.0)):
        cfg = config(token_mask_is_threshold_low=low, token_mask_is_threshold_high=high)
        _, mask, metrics = run(cfg, [0.0, 3.0], [0, 0])
        assert mask.tolist() == [True, False] and metrics["token_mask_masked_ratio"] == 0.5
