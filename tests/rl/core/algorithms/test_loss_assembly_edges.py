"""The loss assembly's plumbing, by hand: what reaches the policy loss from `compute_policy_loss` on a packed
layout, the input checks and their messages, the settings' bounds, the reductions' registration and the segment
helpers' edges."""

import math

import pytest
import torch

from rl.core.algorithms import LOSS_REDUCTIONS, LossSettings, compute_policy_loss, mini_batch_normalizer
from rl.core.algorithms.reduction import LossReduction, _register, masked_sum
from rl.core.algorithms.segments import count_segments, resolve_seq_ids

F64 = torch.float64


def packed():
    """Two sequences packed flat: [a, b, c | d, e], the first token of each outside the loss mask.

    logp - old per token: [9, 0.5, -0.5 | 9, 0.25]; the masked-out first tokens hold a log ratio that would show.
    """
    logp = torch.tensor([-1.0, -1.0, -2.0, -1.0, -0.75], dtype=F64)
    old = logp - torch.tensor([9.0, 0.5, -0.5, 9.0, 0.25], dtype=F64)
    mask = torch.tensor([False, True, True, False, True])
    seq_ids = torch.tensor([0, 0, 0, 1, 1])
    return logp, old, mask, seq_ids


def test_gspo_on_a_packed_layout_reads_the_mask_and_the_sequences():
    # GSPO's sequence ratio from the masked tokens only: seq 0 mean(0.5, -0.5) = 0 -> s = 1; seq 1 -> exp(0.25).
    # A = 1 on seq 0, -1 on seq 1, clip [0.9, 1.1]: seq 0 loss -1 per token (r = 1 inside the range); seq 1's
    # r = 1.284 lies above 1.1, but with A < 0 the max keeps the unclipped -A r = 1.284: nothing counts as clipped.
    # sequence_mean: (mean(-1, -1) + mean(1.284)) / 2 sequences; a handful of float64 roundings (rel 1e-14)
    logp, old, mask, seq_ids = packed()
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0], dtype=F64)
    settings = LossSettings(policy_loss_type="gspo", loss_reduction="sequence_mean", eps_clip_low=0.1,
                            eps_clip_high=0.1)
    normalizer = settings.normalizer(mask, seq_ids=seq_ids, num_sequences=2)
    loss, metrics = compute_policy_loss(settings, logp, old, adv, mask, normalizer, seq_ids=seq_ids,
                                        num_sequences=2)
    s1 = math.exp(0.25)
    assert loss.item() == pytest.approx((-1.0 + s1) / 2, rel=1e-14)
    assert metrics["pg_clipfrac"].item() == 0.0


def test_dual_clip_cap_and_clip_fraction_reach_the_metrics():
    # clip_ratio_c 2 from the settings; r = exp(0.5 | -0.5 | 0.25) on the loss tokens, A = -1:
    # token b: r 1.65 -> max(1.65, 1.2) = 1.65, below the cap 2: kept; token c: r 0.61 -> max(0.61, 0.8) = 0.8
    # (clipped); token e: r 1.28 -> 1.28. The first tokens' r = exp(9) would hit the cap, but they are masked.
    logp, old, mask, seq_ids = packed()
    adv = -torch.ones(5, dtype=F64)
    settings = LossSettings(policy_loss_type="dual_clip", clip_ratio_c=2.0)
    normalizer = settings.normalizer(mask, seq_ids=seq_ids)
    loss, metrics = compute_policy_loss(settings, logp, old, adv, mask, normalizer, seq_ids=seq_ids)
    want = (math.exp(0.5) + 0.8 + math.exp(0.25)) / 3
    assert loss.item() == pytest.approx(want, rel=1e-14)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 3, rel=1e-15)
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    # with the cap at 1.5, token b (1.65) is lowered to 1.5
    settings = LossSettings(policy_loss_type="dual_clip", clip_ratio_c=1.5)
    loss, metrics = compute_policy_loss(settings, logp, old, adv, mask, normalizer, seq_ids=seq_ids)
    assert loss.item() == pytest.approx((1.5 + 0.8 + math.exp(0.25)) / 3, rel=1e-14)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 3, rel=1e-15)


def test_flag_metrics_keep_the_float64_of_the_inputs():
    # rollout_is on the packed tokens, band (0.8, 1.3): r = exp(0.5) is outside, exp(-0.5) = 0.61 outside,
    # exp(0.25) inside: pg_clipfrac = 2 / 3 in float64
    logp, old, mask, seq_ids = packed()
    settings = LossSettings(policy_loss_type="rollout_is", eps_clip_high=0.3)
    loss, metrics = compute_policy_loss(settings, logp, old, torch.ones(5, dtype=F64), mask,
                                        settings.normalizer(mask, seq_ids=seq_ids), seq_ids=seq_ids)
    assert metrics["pg_clipfrac"].dtype == F64 and metrics["pg_clipfrac"].item() == 2 / 3
    assert loss.item() == pytest.approx(-math.exp(0.25) * -0.75 / 3, rel=1e-15)


@pytest.mark.parametrize("name", ["old_logprobs", "advantages", "loss_mask", "ref_logprobs", "entropy", "seq_ids"])
def test_every_token_input_must_have_the_logprobs_shape(name):
    logp, old, mask, seq_ids = packed()
    inputs = {"old_logprobs": old, "advantages": torch.ones(5, dtype=F64), "loss_mask": mask,
              "ref_logprobs": old, "entropy": old, "seq_ids": seq_ids}
    inputs[name] = inputs[name][:4]
    settings = LossSettings()
    with pytest.raises(ValueError, match=rf"^{name} has shape \(4,\) but logprobs has \(5,\)$"):
        compute_policy_loss(settings, logp, inputs["old_logprobs"], inputs["advantages"], inputs["loss_mask"],
                            settings.normalizer(mask, seq_ids=seq_ids), ref_logprobs=inputs["ref_logprobs"],
                            entropy=inputs["entropy"], seq_ids=inputs["seq_ids"])


def test_missing_inputs_errors_name_the_key():
    logp, old, mask, seq_ids = packed()
    adv = torch.ones(5, dtype=F64)
    for fields, message in (({"use_kl_loss": True},
                             "trainer.algorithm.use_kl_loss is on but no ref_logprobs were given"),
                            ({"use_entropy_loss": True},
                             "trainer.algorithm.use_entropy_loss is on but no entropy was given")):
        settings = LossSettings(**fields)
        with pytest.raises(ValueError, match=rf"^{message}$"):
            compute_policy_loss(settings, logp, old, adv, mask, settings.normalizer(mask, seq_ids=seq_ids),
                                seq_ids=seq_ids)


@pytest.mark.parametrize(("fields", "message"), [
    ({"policy_loss_type": "ppo"}, "trainer.algorithm.policy_loss_type: unknown policy loss 'ppo'"),
    ({"loss_reduction": "mean"}, "trainer.algorithm.loss_reduction: unknown loss reduction 'mean'"),
    ({"kl_estimator_type": "k9"}, "trainer.algorithm.kl_estimator_type: unknown KL estimator 'k9'"),
    ({"eps_clip_low": 1.0}, r"trainer.algorithm.eps_clip_low must be in \[0, 1\), got 1.0$"),
    ({"eps_clip_high": -0.5}, "trainer.algorithm.eps_clip_high must be >= 0, got -0.5$"),
    ({"policy_loss_type": "dual_clip", "clip_ratio_c": 1.0},
     "trainer.algorithm.clip_ratio_c must be > 1 for dual_clip, got 1.0$"),
    ({"clip_cov_lb": 5.0, "clip_cov_ub": 1.0},
     r"trainer.algorithm.clip_cov.clip_cov_lb \(5.0\) must be below trainer.algorithm.clip_cov.clip_cov_ub \(1.0\)$"),
    ({"loss_reduction": "seq_mean_token_sum_norm", "max_generate_length": 0},
     r"loss reduction 'seq_mean_token_sum_norm' needs a positive max_generate_length "
     r"\(generator.max_generate_length\), got 0$"),
])
def test_settings_errors_start_with_the_key(fields, message):
    with pytest.raises(ValueError, match="^" + message):
        LossSettings(**fields)


def test_settings_accept_their_bounds():
    assert LossSettings(eps_clip_low=0.0).eps_clip_low == 0.0
    assert LossSettings(eps_clip_high=0.0).eps_clip_high == 0.0
    assert LossSettings(policy_loss_type="dual_clip", clip_ratio_c=1.5).clip_ratio_c == 1.5
    assert LossSettings(clip_cov_ratio=1.0, kl_cov_frac=1.0).kl_cov_frac == 1.0
    assert LossSettings(ppo_kl_coef=0.0).ppo_kl_coef == 0.0
    assert LossSettings(loss_reduction="seq_mean_token_sum_norm", max_generate_length=1).max_generate_length == 1


def test_the_normalizer_of_a_packed_mini_batch():
    _, _, mask, seq_ids = packed()
    settings = LossSettings(loss_reduction="sequence_mean")
    normalizer = settings.normalizer(mask, seq_ids=seq_ids)
    assert (normalizer.num_tokens, normalizer.num_sequences, normalizer.dp_world_size) == (3.0, 2.0, 1)
    assert mini_batch_normalizer("token_mean", mask.reshape(1, 5)).dp_world_size == 1


def test_a_reduction_registers_under_its_name():
    def doubled_sum(per_token_loss, mask, denominator, seq_ids=None, num_sequences=None):
        return 2 * masked_sum(per_token_loss, mask) / denominator

    def rule(tokens, sequences, max_len):
        return float(tokens + sequences)

    assert _register("doubled_sum_for_test", rule)(doubled_sum) is doubled_sum
    try:
        entry = LOSS_REDUCTIONS.get("doubled_sum_for_test")
        assert isinstance(entry, LossReduction) and entry.name == "doubled_sum_for_test"
        assert entry.reduce is doubled_sum and entry.denominator is rule
        values = torch.tensor([1.0, 2.0, 4.0])
        assert entry(values, torch.tensor([True, False, True]), 5.0).item() == 2.0
    finally:
        LOSS_REDUCTIONS.remove("doubled_sum_for_test")


def test_seq_ids_are_required_for_flat_tensors_and_must_match():
    with pytest.raises(ValueError, match=r"^seq_ids is required for a 1-D token tensor of shape \(5,\); pass seq_ids "
                                         r"\(e.g. PackedBatch.token_seq_ids\(\)\) or use a padded \[B, T\] tensor$"):
        resolve_seq_ids(torch.zeros(5), None)
    with pytest.raises(ValueError, match=r"^seq_ids has shape \(4,\) but the token tensor has \(5,\)$"):
        resolve_seq_ids(torch.zeros(5), torch.zeros(4, dtype=torch.long))
    assert resolve_seq_ids(torch.zeros(2, 3), None).tolist() == [[0, 0, 0], [1, 1, 1]]


def test_segments_are_counted_from_the_largest_id():
    assert count_segments(torch.tensor([0, 2, 2]), None) == 3
    assert count_segments(torch.zeros(0, dtype=torch.long), None) == 0
    assert count_segments(torch.tensor([0, 0]), 4) == 4
