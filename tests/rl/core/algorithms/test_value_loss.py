"""The critic's loss (`value_loss.py`) against hand-computed values of veRL's and SkyRL's clipped value loss.

All inputs are multiples of 1/4 with clip 0.5, so every intermediate is a dyadic rational: the comparisons are
exact in float64.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from rl.core.algorithms import LossNormalizer, mini_batch_normalizer
from rl.core.algorithms.value_loss import (
    ValueLossSettings,
    clipped_value_loss,
    compute_value_loss,
    explained_variance,
)

F64 = torch.float64
# loss = 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -0.5, 0.5) - R)^2), clip flag where the second is larger
#   0: V 1,    old 0, R 0:  1 vs (0.5 - 0)^2 = 0.25          -> 0.5,      flag 0
#   1: V 0,    old 1, R 0:  0 vs (0.5 - 0)^2 = 0.25          -> 0.125,    flag 1
#   2: V 2,    old 2, R 3:  1 vs (2 - 3)^2 = 1 (a tie)       -> 0.5,      flag 0
#   3: V -1,   old 0, R 1:  4 vs (-0.5 - 1)^2 = 2.25         -> 2,        flag 0
#   4: V 0.25, old 0, R -1: 1.5625 vs the same (inside)      -> 0.78125,  flag 0
#   5: V 3,    old 0, R 2:  1 vs (0.5 - 2)^2 = 2.25          -> 1.125,    flag 1
VALUES = [1.0, 0.0, 2.0, -1.0, 0.25, 3.0]
OLD = [0.0, 1.0, 2.0, 0.0, 0.0, 0.0]
RETURNS = [0.0, 0.0, 3.0, 1.0, -1.0, 2.0]
LOSS = [0.5, 0.125, 0.5, 2.0, 0.78125, 1.125]
FLAGS = [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
UNCLIPPED = [0.5, 0.0, 0.5, 2.0, 0.78125, 0.5]


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def test_clipped_value_loss_hand_computed():
    loss, flags = clipped_value_loss(t(VALUES), t(OLD), t(RETURNS), 0.5)
    assert loss.tolist() == LOSS and flags.tolist() == FLAGS
    assert flags.dtype == F64


def test_clipped_value_loss_gradient_follows_the_larger_term():
    # d/dV of 0.5 (V - R)^2 is V - R where the unclipped term is larger; 0 where the clipped value is held at
    # V_old +- 0.5 (tokens 1 and 5); token 2 is a tie of two equal terms, whose gradients agree (V - R = -1)
    values = t(VALUES).requires_grad_(True)
    loss, _ = clipped_value_loss(values, t(OLD), t(RETURNS), 0.5)
    loss.sum().backward()
    assert values.grad.tolist() == [1.0, 0.0, -1.0, -2.0, 1.25, 0.0]


def test_no_clipping_is_half_the_squared_error():
    loss, flags = clipped_value_loss(t(VALUES), t(OLD), t(RETURNS), None)
    assert loss.tolist() == UNCLIPPED and flags.tolist() == [0.0] * 6
    assert flags.shape == (6,)


def batch():
    """The six tokens as two padded rows of four (two padding tokens holding values that would show if counted)."""
    pad = 100.0
    values = t([[*VALUES[:3], pad], [*VALUES[3:], pad]])
    old = t([[*OLD[:3], -pad], [*OLD[3:], -pad]])
    returns = t([[*RETURNS[:3], pad], [*RETURNS[3:], -pad]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, False]])
    return values, old, returns, mask


def test_compute_value_loss_token_mean_and_metrics():
    values, old, returns, mask = batch()
    settings = ValueLossSettings(value_clip=0.5)
    normalizer = mini_batch_normalizer("token_mean", mask, dp_world_size=2)
    loss, metrics = compute_value_loss(settings, values, old, returns, mask, normalizer)
    assert loss.item() == sum(LOSS) / 6 * 2  # the reduction, times dp_world_size
    assert metrics["vf_loss"].item() == sum(LOSS) / 6
    assert metrics["vf_clipfrac"].item() == 2 / 6
    assert metrics["values_mean"].item() == sum(VALUES) / 6
    assert set(metrics) == {"vf_loss", "vf_clipfrac", "values_mean"}


def test_compute_value_loss_sequence_mean_reads_the_rows():
    # sequence_mean: (mean of row 0 + mean of row 1) / 2, rows being the sequences of a padded batch
    values, old, returns, mask = batch()
    settings = ValueLossSettings(value_clip=0.5, loss_reduction="sequence_mean")
    normalizer = mini_batch_normalizer("sequence_mean", mask)
    loss, metrics = compute_value_loss(settings, values, old, returns, mask, normalizer)
    want = (sum(LOSS[:3]) / 3 + sum(LOSS[3:]) / 3) / 2
    assert loss.item() == pytest.approx(want, rel=1e-15) and metrics["vf_loss"].item() == loss.item()
    # the same tokens packed flat, with their sequence ids
    packed = [x[mask] for x in (values, old, returns, mask)]
    seq_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    flat, _ = compute_value_loss(settings, *packed, normalizer, seq_ids=seq_ids, num_sequences=2)
    assert flat.item() == loss.item()


def test_compute_value_loss_counts_the_rows_of_a_padded_batch_as_its_sequences():
    # three sequences of two tokens (more rows than columns): sequence_mean = (0.5 + 2 + 1.125) / 3 over the
    # first tokens of rows 0 and 1 and both tokens of row 2
    values, old, returns = (t([[x[0], x[1]], [x[2], x[3]], [x[4], x[5]]]) for x in (VALUES, OLD, RETURNS))
    mask = torch.tensor([[True, False], [False, True], [True, True]])
    settings = ValueLossSettings(value_clip=0.5, loss_reduction="sequence_mean")
    loss, _ = compute_value_loss(settings, values, old, returns, mask, mini_batch_normalizer("sequence_mean", mask))
    assert loss.item() == pytest.approx((LOSS[0] + LOSS[3] + (LOSS[4] + LOSS[5]) / 2) / 3, rel=1e-15)


def test_compute_value_loss_without_clipping():
    values, old, returns, mask = batch()
    settings = ValueLossSettings(value_clip=None)
    loss, metrics = compute_value_loss(settings, values, old, returns, mask, mini_batch_normalizer("token_mean", mask))
    assert loss.item() == sum(UNCLIPPED) / 6 and metrics["vf_clipfrac"].item() == 0.0


@pytest.mark.parametrize("name", ["old_values", "returns", "loss_mask"])
def test_compute_value_loss_names_a_misshapen_input(name):
    values, old, returns, mask = batch()
    inputs = {"old_values": old, "returns": returns, "loss_mask": mask}
    inputs[name] = inputs[name][:, :3]
    with pytest.raises(ValueError, match=rf"^{name} has shape \(2, 3\) but values has \(2, 4\)$"):
        compute_value_loss(ValueLossSettings(), values, inputs["old_values"], inputs["returns"], inputs["loss_mask"],
                           mini_batch_normalizer("token_mean", mask))


def test_compute_value_loss_refuses_a_normalizer_of_another_reduction():
    values, old, returns, mask = batch()
    with pytest.raises(ValueError, match=r"^normalizer was built for 'sequence_mean' but "
                                         r"trainer\.algorithm\.loss_reduction is 'token_mean'$"):
        compute_value_loss(ValueLossSettings(), values, old, returns, mask,
                           mini_batch_normalizer("sequence_mean", mask))


def test_settings_refuse_a_non_positive_clip():
    for bad in (0.0, -0.1):
        with pytest.raises(ValueError, match=r"trainer\.algorithm\.value_clip must be > 0 or null"):
            ValueLossSettings(value_clip=bad)
    assert ValueLossSettings(value_clip=None).value_clip is None
    assert ValueLossSettings(value_clip=0.01).value_clip == 0.01


def test_settings_from_config_mappings_and_attributes():
    defaults = ValueLossSettings()
    assert (defaults.value_clip, defaults.loss_reduction, defaults.max_generate_length) == (0.2, "token_mean", None)
    assert ValueLossSettings.from_config({}) == defaults
    assert ValueLossSettings.from_config(None, None) == defaults
    want = ValueLossSettings(value_clip=0.5, loss_reduction="seq_mean_token_sum_norm", max_generate_length=64)
    mapping = ValueLossSettings.from_config({"value_clip": 0.5, "loss_reduction": "seq_mean_token_sum_norm"},
                                            {"max_generate_length": 64})
    attributes = ValueLossSettings.from_config(
        SimpleNamespace(value_clip=0.5, loss_reduction="seq_mean_token_sum_norm"),
        SimpleNamespace(max_generate_length=64))
    assert mapping == want and attributes == want
    assert ValueLossSettings.from_config(SimpleNamespace(), SimpleNamespace()) == defaults
    assert ValueLossSettings.from_config({"value_clip": None}).value_clip is None


def test_explained_variance_hand_computed():
    # R = [1, 2, 3, 4]: Var = 5/3 (unbiased); R - V = [0, 0, 0, 1]: Var = 0.25 -> 1 - 0.25 / (5/3) = 0.85
    values = t([1.0, 2.0, 3.0, 3.0, 50.0])
    returns = t([1.0, 2.0, 3.0, 4.0, -50.0])
    mask = torch.tensor([1, 1, 1, 1, 0])
    assert explained_variance(values, returns, mask) == pytest.approx(0.85, rel=1e-15)
    assert explained_variance(returns, returns, mask) == 1.0
    # predicting the mean explains nothing; the opposite deviations explain less than nothing
    assert explained_variance(t([2.5] * 4), returns[:4], mask[:4]) == pytest.approx(0.0, abs=1e-15)
    assert explained_variance(t([4.0, 3.0, 2.0, 1.0]), returns[:4], mask[:4]) == pytest.approx(-3.0, rel=1e-15)
    # two tokens are enough: R = [0, 2] (Var 2), R - V = [0, 1] (Var 0.5)
    assert explained_variance(t([0.0, 1.0]), t([0.0, 2.0]), torch.ones(2)) == pytest.approx(0.75, rel=1e-15)


def test_explained_variance_is_computed_in_float64():
    # float32 inputs near 4096 (ulp 2^-11) that differ by 2^-10: float32 arithmetic loses most of their variance
    base = 4096.0
    returns = torch.tensor([base, base + 2**-10, base + 2 * 2**-10, base + 3 * 2**-10], dtype=torch.float32)
    values = returns.clone()
    values[3] = base + 2 * 2**-10
    # exact: Var(R) = (2^-10)^2 * 5/3, Var(R - V) = (2^-10)^2 * 0.25 -> 0.85
    assert explained_variance(values, returns, torch.ones(4)) == pytest.approx(0.85, rel=1e-12)


def test_explained_variance_is_nan_without_variance_to_explain():
    assert math.isnan(explained_variance(t([1.0, 2.0]), t([3.0, 3.0]), torch.ones(2)))
    assert math.isnan(explained_variance(t([1.0, 2.0]), t([3.0, 4.0]), torch.tensor([1, 0])))  # one token
    assert math.isnan(explained_variance(t([1.0]), t([3.0]), torch.zeros(1)))  # none
    # returns spread by float32 rounding of the values' scale: std = 2^-23 = eps * max|V| is not a variance
    eps = torch.finfo(torch.float32).eps
    returns = t([-eps, 0.0, eps])
    assert math.isnan(explained_variance(t([1.0, 0.0, 0.0]), returns, torch.ones(3)))
    # ... but the same returns are a variance at a scale they dominate (scale = max|R| = eps, not max|V|)
    assert explained_variance(t([0.0, 0.0, 0.0]), returns, torch.ones(3)) == 0.0
    # R - V = [-eps, 0, 0]: Var = eps^2 / 3 against Var(R) = eps^2
    assert explained_variance(t([0.0, 0.0, eps]), returns, torch.ones(3)) == pytest.approx(2 / 3, rel=1e-15)
    # the returns' own magnitude sets the scale too: R = 1 + [0, 1, 2] * 2^-30 varies below float32 rounding of 1
    assert math.isnan(explained_variance(t([0.0, 0.0, 0.0]), t([1.0, 1.0 + 2**-30, 1.0 + 2**-29]), torch.ones(3)))


def test_normalizer_mismatch_uses_from_counts_too():
    # a normalizer from counts (summed over ranks) works like one from the mask
    values, old, returns, mask = batch()
    normalizer = LossNormalizer.from_counts("token_mean", 6, 2)
    loss, _ = compute_value_loss(ValueLossSettings(value_clip=0.5), values, old, returns, mask, normalizer)
    assert loss.item() == sum(LOSS) / 6
