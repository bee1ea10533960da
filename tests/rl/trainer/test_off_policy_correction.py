"""The trainer-vs-rollout gap and the off-policy corrections on the training path: `measure_and_correct` on a
hand-built rollout batch, and a launcher run (Ray workers, the HF engine) where a correction is on, so the old
logprobs get their own pass, the gap is logged, and a token mask that rejects every token leaves nothing to learn
from (zero gradient)."""

import math
from types import SimpleNamespace

import pytest
import torch

from rl.trainer.experience import Experience
from rl.trainer.rollout_mismatch import anchor_on_rollout, measure_and_correct, skips_old_logprob_pass
from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train
from tests.testing.tolerances import EXP_ROUNDINGS, gamma, unit_roundoff

OFF = dict(tis_ratio_type=None, token_tis_ratio_clip_high=2.0, sequence_tis_ratio_clip_high=5.0,
           sequence_mask_metric=None, geo_mask_high=1.01, geo_mask_low=0.99, product_mask_high=2.0,
           product_mask_low=0.5, outlier_token_is_threshold_low=None, outlier_token_is_threshold_high=None,
           token_mask_is_threshold_low=None, token_mask_is_threshold_high=None)


def _experience() -> Experience:
    def seq(old, rollout, adv):
        n = len(old)
        return {"input_ids": torch.arange(n), "loss_mask": torch.tensor([False] + [True] * (n - 1)),
                "advantages": torch.tensor([0.0] + [adv] * (n - 1)), "old_logprobs": torch.tensor(old),
                "rollout_logprobs": torch.tensor(rollout)}

    return Experience(sequences=[seq([0.0, -1.0, -2.0], [0.0, -2.0, -2.0], 1.0),  # log ratios 1, 0
                                 seq([0.0, -1.0], [0.0, -0.5], -2.0)],  # log ratio -0.5
                      rewards=torch.zeros(2), response_lengths=torch.tensor([2, 1]))


def test_measure_and_correct_scales_advantages_and_masks_tokens():
    experience = _experience()
    metrics = measure_and_correct(experience, SimpleNamespace(**{**OFF, "tis_ratio_type": "token"}))
    assert metrics["rollout_logprob_abs_diff_max"] == pytest.approx(1.0)
    assert metrics["rollout_logprob_abs_diff_mean"] == pytest.approx(1.5 / 3)
    first, second = experience.sequences
    torch.testing.assert_close(first["advantages"], torch.tensor([0.0, 2.0, 1.0]))  # min(e, 2) * 1, 1 * 1
    torch.testing.assert_close(second["advantages"], torch.tensor([0.0, -2.0 * math.exp(-0.5)]))

    experience = _experience()
    measure_and_correct(experience, SimpleNamespace(**{**OFF, "outlier_token_is_threshold_high": 2.0}))
    assert experience.sequences[0]["loss_mask"].tolist() == [False, False, False]  # e^1 > 2: whole sequence out
    assert experience.sequences[1]["loss_mask"].tolist() == [False, True]

    experience = _experience()
    assert "tis_token_clip_high_ratio" not in measure_and_correct(experience, SimpleNamespace(**OFF))
    assert experience.sequences[0]["advantages"].tolist() == [0.0, 1.0, 1.0]  # measured, not corrected


def test_rollout_is_takes_its_ratio_to_the_engine_after_the_gap_is_measured():
    """`anchor_on_rollout` after `measure_and_correct`: the gap is the trainer's old logprobs against the engine's,
    and then the engine's are the old logprobs the loss reads. First sequence at logprobs = its old ones: the ratios
    to the engine are e^1 (outside rollout_is's band: no gradient) and 1 (inside: -A per unit logp)."""
    from rl.core.algorithms import POLICY_LOSSES

    experience = _experience()
    metrics = measure_and_correct(experience, SimpleNamespace(**OFF))
    anchor_on_rollout(experience)
    assert metrics["rollout_logprob_abs_diff_max"] == pytest.approx(1.0)
    first = experience.sequences[0]
    assert first["old_logprobs"].tolist() == [0.0, -2.0, -2.0]
    logprob = torch.tensor([0.0, -1.0, -2.0], requires_grad=True)
    loss, _ = POLICY_LOSSES.get("rollout_is")(logprob, first["old_logprobs"], first["advantages"], first["loss_mask"],
                                             eps_clip_low=0.2, eps_clip_high=0.2)
    (loss * first["loss_mask"]).sum().backward()
    assert logprob.grad.tolist() == [0.0, 0.0, -1.0]


def test_the_on_policy_shortcut_only_without_a_correction():
    def cfg(**correction):
        return SimpleNamespace(generator=SimpleNamespace(backend="hf"),
                               trainer=SimpleNamespace(algorithm=SimpleNamespace(
                                   off_policy_correction=SimpleNamespace(**{**OFF, **correction}))))

    assert skips_old_logprob_pass(cfg(), on_policy=True)
    assert not skips_old_logprob_pass(cfg(), on_policy=False)
    assert not skips_old_logprob_pass(cfg(tis_ratio_type="token"), on_policy=True)


def test_a_run_logs_the_gap_and_a_rejecting_mask_stops_learning(tmp_path):
    job = make_tiny_job(str(tmp_path / "job"))
    run_dir = str(tmp_path / "run")
    key = "trainer.algorithm.off_policy_correction."
    result = run_train(run_dir, [*job.overrides(steps=1), "data.reward_fn=gsm8k_flexible",
                                 "trainer.algorithm.use_kl_loss=false",
                                 key + "token_mask_is_threshold_low=1.5", key + "token_mask_is_threshold_high=2.0"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    row = next(r for r in read_metrics(f"{run_dir}/metrics.jsonl") if r["step"] == 1)
    # the HF engine samples with the trainer's numerics: ratios ~1, all below 1.5, so every token is rejected
    assert row["rollout_logprob_abs_diff_max"] < 1e-3
    # ESS = (sum r)^2 / (n sum r^2) over n <= 4 x 4 x 12 loss tokens whose ratios r = e^d lie within e^(+-D),
    # D the logged largest |d| plus the float32 exp's rounding: at most 1 (Cauchy-Schwarz) and at least
    # 4 e^-D e^D / (e^-D + e^D)^2 = 1 / cosh(D)^2 (Kantorovich); the two n-term sums of positive terms, the square,
    # the product and the division round within gamma_(2n + 4)
    tokens = 4 * 4 * 12
    rounding = gamma(2 * tokens + 4, torch.float32)
    spread = row["rollout_logprob_abs_diff_max"] + EXP_ROUNDINGS * unit_roundoff(torch.float32)
    assert (1 - rounding) / math.cosh(spread) ** 2 <= row["rollout_is_ess"] <= 1 + rounding, row
    assert row["token_mask_masked_ratio"] == 1.0
    assert row["grad_norm"] == 0.0 and row["pg_loss"] == 0.0
