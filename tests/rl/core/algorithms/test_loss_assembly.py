"""compute_policy_loss: hand-computed assembly, settings from config, and gradient invariance of every reduction
under micro-batch size (1, 2, 8) and data-parallel size (1 vs 2 simulated ranks) for every per-token loss (the
covariance losses select tokens within the micro-batch they see, as in the peers)."""

import itertools
from types import SimpleNamespace

import pytest
import torch

from rl.core.algorithms import LOSS_REDUCTIONS, POLICY_LOSSES, LossSettings, compute_policy_loss
from rl.core.algorithms.policy_loss import COVARIANCE_LOSSES
from tests.testing.tolerances import assert_within, gamma, network_rtol

F64 = torch.float64


def test_hand_computed_assembly():
    # ratio 1 everywhere, A = [1, -1] -> pg = [-1, 1]; k1 kl = logp - ref = [0.5, 0]; entropy [2, 4]
    # per token: pg + 0.1 * kl - 0.01 * entropy = [-1 + 0.05 - 0.02, 1 - 0.04] = [-0.97, 0.96]
    # token_mean over 2 tokens: -0.005; dp_world_size 2 doubles the loss only
    settings = LossSettings(
        use_kl_loss=True, kl_loss_coef=0.1, kl_estimator_type="k1", use_entropy_loss=True, entropy_loss_coef=0.01
    )
    logp = torch.tensor([[-1.0, -2.0]], dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    normalizer = settings.normalizer(mask, dp_world_size=2)
    loss, metrics = compute_policy_loss(
        settings,
        logp,
        logp.clone(),
        torch.tensor([[1.0, -1.0]], dtype=F64),
        mask,
        normalizer,
        ref_logprobs=torch.tensor([[-1.5, -2.0]], dtype=F64),
        entropy=torch.tensor([[2.0, 4.0]], dtype=F64),
    )
    torch.testing.assert_close(loss, torch.tensor(-0.01, dtype=F64))
    torch.testing.assert_close(metrics["pg_loss"], torch.tensor(0.0, dtype=F64))
    torch.testing.assert_close(metrics["kl_loss"], torch.tensor(0.25, dtype=F64))
    torch.testing.assert_close(metrics["entropy"], torch.tensor(3.0, dtype=F64))
    torch.testing.assert_close(metrics["pg_clipfrac"], torch.tensor(0.0, dtype=F64))


@pytest.mark.parametrize("policy_loss_type", ["regular", "dual_clip"])
def test_on_policy_old_logprobs_none_is_the_plain_policy_gradient(policy_loss_type):
    # old_logprobs=None: ratio exp(logp - logp.detach()) = 1, so per token pg = -A and d pg / d logp = -A.
    # A = [2, -1, 0.5] with the last token masked: token_mean over 2 tokens -> loss -(2 - 1) / 2 = -0.5,
    # grad wrt logp = [-2, 1, 0] / 2; nothing clipped.
    settings = LossSettings(use_kl_loss=False, policy_loss_type=policy_loss_type)
    logp = torch.tensor([[-0.3, -1.2, -2.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    loss, metrics = compute_policy_loss(settings, logp, None, torch.tensor([[2.0, -1.0, 0.5]], dtype=F64), mask,
                                        settings.normalizer(mask))
    loss.backward()
    torch.testing.assert_close(loss.detach(), torch.tensor(-0.5, dtype=F64))
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, 0.5, 0.0]], dtype=F64))
    assert float(metrics["pg_clipfrac"]) == 0.0


def test_settings_from_config_reads_names():
    algorithm = SimpleNamespace(
        policy_loss_type="gspo",
        loss_reduction="seq_mean_token_sum_norm",
        eps_clip_low=3e-4,
        eps_clip_high=4e-4,
        use_kl_loss=True,
        kl_estimator_type="k2",
        unrelated="x",
    )
    generator = SimpleNamespace(max_generate_length=1024)
    settings = LossSettings.from_config(algorithm, generator)
    assert settings.policy_loss_type == "gspo" and settings.max_generate_length == 1024
    assert settings.eps_clip_high == 4e-4 and settings.kl_estimator_type == "k2" and settings.use_kl_loss
    assert settings.clip_ratio_c == LossSettings.clip_ratio_c  # absent attribute keeps its default
    assert LossSettings.from_config({"loss_reduction": "sequence_mean"}).loss_reduction == "sequence_mean"


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"policy_loss_type": "ppo"}, "trainer.algorithm.policy_loss_type"),
        ({"loss_reduction": "mean"}, "trainer.algorithm.loss_reduction"),
        ({"kl_estimator_type": "k9"}, "trainer.algorithm.kl_estimator_type"),
        ({"eps_clip_low": 1.5}, "trainer.algorithm.eps_clip_low"),
        ({"policy_loss_type": "dual_clip", "clip_ratio_c": 0.5}, "trainer.algorithm.clip_ratio_c"),
        ({"loss_reduction": "seq_mean_token_sum_norm"}, "generator.max_generate_length"),
        ({"tau_neg": 0.0}, "trainer.algorithm.sapo.tau_neg"),
        ({"clip_cov_ratio": 1.5}, "trainer.algorithm.clip_cov.clip_ratio"),
        ({"clip_cov_lb": 5.0}, "trainer.algorithm.clip_cov.clip_cov_lb"),
        ({"kl_cov_frac": 0.0}, "trainer.algorithm.kl_cov.kl_cov_frac"),
        ({"ppo_kl_coef": -1.0}, "trainer.algorithm.kl_cov.ppo_kl_coef"),
    ],
)
def test_settings_errors_name_the_key(fields, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        LossSettings(**fields)


def test_loss_options_come_from_their_blocks_and_reach_the_loss():
    algorithm = SimpleNamespace(policy_loss_type="sapo", sapo={"tau_pos": 2.0, "tau_neg": 3.0},
                                clip_cov=SimpleNamespace(clip_ratio=0.5, clip_cov_lb=0.0, clip_cov_ub=1.0),
                                kl_cov=SimpleNamespace(kl_cov_frac=0.3, ppo_kl_coef=0.5))
    settings = LossSettings.from_config(algorithm)
    assert settings.loss_options() == {"tau_pos": 2.0, "tau_neg": 3.0, "clip_cov_ratio": 0.5, "clip_cov_lb": 0.0,
                                       "clip_cov_ub": 1.0, "kl_cov_frac": 0.3, "ppo_kl_coef": 0.5}
    # ratio 1, A = [1, -1]: sapo's gate is 4 sigmoid(0) / tau = 2 / tau -> pg = [-2 / 2, 2 / 3]; token mean
    mask = torch.ones(1, 2, dtype=torch.bool)
    logp = torch.tensor([[-1.0, -2.0]], dtype=F64)
    loss, _ = compute_policy_loss(LossSettings(policy_loss_type="sapo", tau_pos=2.0, tau_neg=3.0, use_kl_loss=False),
                                  logp, logp.clone(), torch.tensor([[1.0, -1.0]], dtype=F64), mask,
                                  LossSettings(policy_loss_type="sapo").normalizer(mask))
    want = torch.tensor((-1.0 + 2.0 / 3.0) / 2, dtype=F64)
    assert_within(loss, want, 2 * gamma(8, F64) * 1.0)  # terms of magnitude <= 1, a handful of roundings


def test_missing_inputs_name_the_key():
    settings = LossSettings(use_kl_loss=True)
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"use_kl_loss.*ref_logprobs"):
        compute_policy_loss(settings, x, x, x, x.bool(), settings.normalizer(x.bool()))
    with pytest.raises(ValueError, match="sequence_mean"):
        compute_policy_loss(settings, x, x, x, x.bool(), LossSettings(loss_reduction="sequence_mean").normalizer(x))


# ---- gradient invariance -------------------------------------------------------------------------------------

S, T = 8, 7


def mini_batch():
    gen = torch.Generator().manual_seed(11)
    lengths = torch.tensor([7, 1, 3, 6, 2, 7, 4, 5])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(S, T, generator=gen, dtype=F64) * 3
    return {
        "logp": (old + 0.3 * torch.randn(S, T, generator=gen, dtype=F64)).detach(),
        "old": old,
        "ref": old + 0.2 * torch.randn(S, T, generator=gen, dtype=F64),
        "adv": torch.randn(S, 1, generator=gen, dtype=F64).expand(S, T).contiguous(),
        "mask": mask,
    }


def settings_for(policy_loss, reduction):
    eps = (3e-2, 4e-2) if policy_loss == "gspo" else (0.2, 0.28)
    return LossSettings(
        policy_loss_type=policy_loss,
        loss_reduction=reduction,
        eps_clip_low=eps[0],
        eps_clip_high=eps[1],
        use_kl_loss=True,
        kl_loss_coef=0.05,
        use_entropy_loss=True,
        entropy_loss_coef=0.01,
        max_generate_length=T,
    )


def run_rank(settings, data, rows, micro_batch_size, normalizer):
    """Gradient w.r.t. a leaf logprob tensor and summed metrics, micro-batch losses summed as a backend does."""
    logp = data["logp"].clone().requires_grad_(True)
    totals = {}
    for start in range(0, len(rows), micro_batch_size):
        idx = torch.tensor(rows[start : start + micro_batch_size])
        lp = logp[idx]
        entropy = -(lp.exp() * lp)  # any differentiable function of logp stands in for the entropy
        loss, metrics = compute_policy_loss(
            settings,
            lp,
            data["old"][idx],
            data["adv"][idx],
            data["mask"][idx],
            normalizer,
            ref_logprobs=data["ref"][idx],
            entropy=entropy,
        )
        loss.backward()
        for name, value in metrics.items():
            totals[name] = totals.get(name, 0.0) + value
    return logp.grad, totals


PER_TOKEN_LOSSES = [name for name in POLICY_LOSSES if name not in COVARIANCE_LOSSES]


# A token's loss term and its slope are closed forms of its own logprobs and advantage (an exp or a sigmoid, a
# log, the clip's products and the division by the normalizer: fewer than this many roundings, Higham's gamma_k).
TOKEN_ROUNDINGS = 64


def f64_bounds(settings, data, reference):
    """Gaps of two float64 runs that split the same mini-batch into other micro-batches (or ranks): each differs
    from the exact value by gamma_k of the magnitudes met (`network_rtol`, twice for two orders), k the sums on the
    path: the mini-batch's S * T tokens, a micro-batch total per row, a sequence's T tokens (gspo's mean log-ratio,
    which enters an exp: the condition 1 + max|log r| carries its error into the ratio), a token's closed form.
    Gradient: relative to its largest |element|, as `tolerances.gradient_gap`. Metrics: weighted means (weights >= 0
    summing to <= 1) of per-token terms each within `scale` (the surrogate |A| max(r, clip_ratio_c, sapo's 4/tau)
    (1 + |log p|), k3, the entropy, the ratio r, |log r|, an indicator), so each is within gamma_k of that scale."""
    mask = data["mask"]
    log_ratio = (data["logp"] - data["old"])[mask].abs()
    rtol = network_rtol([S * T, S, T, TOKEN_ROUNDINGS], F64, condition=1 + float(log_ratio.max()))
    x = (data["logp"] - data["ref"])[mask]
    k3 = torch.exp(-x) + x - 1
    logp = data["logp"][mask]
    gate = max(settings.clip_ratio_c, 4.0 / min(settings.tau_pos, settings.tau_neg))
    surrogate = data["adv"][mask].abs() * torch.clamp(log_ratio.exp(), min=gate) * (1 + logp.abs())
    scale = float((surrogate + k3 + (logp.exp() * logp).abs() + log_ratio.exp() + log_ratio + 1).max())
    return rtol * float(reference.abs().max()), rtol * scale


@pytest.mark.parametrize(("policy_loss", "reduction"), list(itertools.product(PER_TOKEN_LOSSES, LOSS_REDUCTIONS)))
def test_gradient_is_independent_of_micro_batch_and_dp_split(policy_loss, reduction):
    settings = settings_for(policy_loss, reduction)
    data = mini_batch()
    every = list(range(S))
    whole = settings.normalizer(data["mask"])
    reference, ref_metrics = run_rank(settings, data, every, S, whole)
    assert reference.abs().sum() > 0
    grad_gap, metric_gap = f64_bounds(settings, data, reference)
    for micro in (1, 2, 8):
        grad, metrics = run_rank(settings, data, every, micro, whole)
        assert_within(grad, reference, grad_gap, f"gradient, micro-batch {micro}")
        for name, value in ref_metrics.items():
            assert_within(metrics[name], value, metric_gap, f"{name}, micro-batch {micro}")
    shards = [[0, 3, 4, 7], [1, 2, 5, 6]]
    # gradients SUMMED across ranks: dp_world_size=1
    summed = sum(run_rank(settings, data, rows, 2, whole)[0] for rows in shards)
    assert_within(summed, reference, grad_gap, "gradient summed over ranks")
    # gradients AVERAGED across ranks (DDP/FSDP default): the normalizer carries dp_world_size=2
    scaled = settings.normalizer(data["mask"], dp_world_size=2)
    averaged = sum(run_rank(settings, data, rows, 1, scaled)[0] for rows in shards) / 2
    assert_within(averaged, reference, grad_gap, "gradient averaged over ranks")


def test_covariance_losses_select_within_the_micro_batch_they_see():
    # kl_cov on rows 0-3 alone picks the top covariance token among those rows' tokens; the same rows inside the
    # whole mini-batch are ranked against the others' tokens too (the documented dependence on the split)
    data = mini_batch()
    kwargs = {"eps_clip_low": 0.2, "eps_clip_high": 0.2, "kl_cov_frac": 0.2}
    part = slice(0, 4)
    _, alone = POLICY_LOSSES.get("kl_cov")(data["logp"][part], data["old"][part], data["adv"][part],
                                           data["mask"][part], **kwargs)
    _, inside = POLICY_LOSSES.get("kl_cov")(data["logp"], data["old"], data["adv"], data["mask"], **kwargs)
    assert alone["kl_cov_frac"].sum() == max(1, int(int(data["mask"][part].sum()) * 0.2))
    assert inside["kl_cov_frac"].sum() == max(1, int(int(data["mask"].sum()) * 0.2))
    assert not torch.equal(alone["kl_cov_frac"], inside["kl_cov_frac"][part])


def test_micro_batch_mean_would_not_be_invariant():
    # the oracle is sensitive: normalizing each micro-batch by its own token count changes the gradient
    settings = settings_for("regular", "token_mean")
    data = mini_batch()
    whole = settings.normalizer(data["mask"])
    reference, _ = run_rank(settings, data, list(range(S)), S, whole)
    logp = data["logp"].clone().requires_grad_(True)
    for rows in ([0, 1], [2, 3], [4, 5], [6, 7]):
        idx = torch.tensor(rows)
        local = settings.normalizer(data["mask"][idx])
        lp = logp[idx]
        loss, _ = compute_policy_loss(
            settings,
            lp,
            data["old"][idx],
            data["adv"][idx],
            data["mask"][idx],
            local,
            ref_logprobs=data["ref"][idx],
            entropy=-(lp.exp() * lp),
        )
        (loss / 4).backward()
    assert not torch.allclose(logp.grad, reference)


def test_the_logprob_gap_is_the_token_mean_of_the_distance_to_the_old_logprobs():
    """`measure_logprob_gap` (trainer.exact_on_policy): |logprob - old| averaged over the loss tokens, by hand:
    tokens 0, 1 and 3 count (token 2 is masked), differences -0.25, 0 and 1.5, so
    (0.25 + 1.5) / 3; not reported unless asked."""
    logp = torch.tensor([[-1.0, -2.0, -3.0, -0.5]], dtype=torch.float64)
    old = torch.tensor([[-0.75, -2.0, -9.0, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.float64)
    advantages = torch.ones(1, 4, dtype=torch.float64)
    settings = LossSettings(measure_logprob_gap=True)
    _, metrics = compute_policy_loss(settings, logp, old, advantages, mask, settings.normalizer(mask))
    assert float(metrics["exact_logprob_gap"]) == pytest.approx(1.75 / 3, rel=1e-15)
    plain = LossSettings()
    _, metrics = compute_policy_loss(plain, logp, old, advantages, mask, plain.normalizer(mask))
    assert "exact_logprob_gap" not in metrics


def test_the_on_policy_shortcut_measures_the_gap_to_the_rollout_logprobs():
    """`measure_rollout_gap` (the old-logprob pass skipped): |logprob - rollout| over the loss tokens, by hand: tokens
    0, 1 and 3 count, differences 0.5, -0.25 and 0, so 0.75 / 3. The ratio stays exactly 1 (the loss equals the one
    without rollout logprobs), and nothing is reported without the setting or without rollout logprobs."""
    logp = torch.tensor([[-1.0, -2.0, -3.0, -0.5]], dtype=torch.float64)
    rollout = torch.tensor([[-1.5, -1.75, -7.0, -0.5]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, -0.5, 2.0, 0.25]], dtype=torch.float64)
    settings = LossSettings(measure_rollout_gap=True)
    loss, metrics = compute_policy_loss(settings, logp, None, advantages, mask, settings.normalizer(mask),
                                        rollout_logprobs=rollout)
    assert float(metrics["rollout_logprob_abs_diff_mean"]) == pytest.approx(0.75 / 3, rel=1e-15)
    alone, _ = compute_policy_loss(settings, logp, None, advantages, mask, settings.normalizer(mask))
    assert float(loss) == float(alone)
    _, metrics = compute_policy_loss(settings, logp, None, advantages, mask, settings.normalizer(mask))
    assert "rollout_logprob_abs_diff_mean" not in metrics
    plain = LossSettings()
    _, metrics = compute_policy_loss(plain, logp, None, advantages, mask, plain.normalizer(mask),
                                     rollout_logprobs=rollout)
    assert "rollout_logprob_abs_diff_mean" not in metrics
