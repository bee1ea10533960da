"""The SFT and DPO/IPO losses and metrics on a few tokens, written out by hand (Rafailov et al. 2023, Azar et al.
2023, NeMo RL's DPO keys), and their settings' checks.

Two pairs, packed: sequence 2k is pair k's chosen response, 2k + 1 its rejected one; the first token of each is
outside the loss mask and holds a value that would show if it were counted.

    seq 0 (chosen):   logp [7, -1, -0.5],   ref [7, -1.5, -0.5]   -> h_w = 0.5 (mean 0.25), NLL 1.5 (mean 0.75)
    seq 1 (rejected): logp [7, -2],         ref [7, -1]           -> h_l = -1 (mean -1)
    seq 2 (chosen):   logp [7, -0.25],      ref [7, -0.25]        -> h_w = 0, NLL 0.25 (mean 0.25)
    seq 3 (rejected): logp [7, -0.5, -0.5], ref [7, -0.75, -0.25] -> h_l = 0 (mean 0): a tie with its chosen
"""

import math

import pytest
import torch
import torch.nn.functional as F

from rl.core.algorithms import LossNormalizer
from rl.core.algorithms.dpo_loss import DpoLossSettings
from rl.core.algorithms.sft_loss import SftLossSettings, compute_sft_loss
from rl.core.packing import pack_sequences
from tests.testing.tolerances import assert_within, gamma

F64 = torch.float64
LOGP = [[7.0, -1.0, -0.5], [7.0, -2.0], [7.0, -0.25], [7.0, -0.5, -0.5]]
REF = [[7.0, -1.5, -0.5], [7.0, -1.0], [7.0, -0.25], [7.0, -0.75, -0.25]]


def pairs(count=2):
    seqs = [{"input_ids": torch.arange(len(lp)), "loss_mask": torch.arange(len(lp)) > 0,
             "ref_logprobs": torch.tensor(ref, dtype=F64)} for lp, ref in zip(LOGP, REF, strict=True)][: 2 * count]
    logprobs = torch.cat([torch.tensor(lp, dtype=F64) for lp in LOGP[: 2 * count]])
    return pack_sequences(seqs), logprobs.requires_grad_(True)


def normalizer(batch, reduction="token_mean", dp_world_size=1):
    return LossNormalizer.from_counts(reduction, int(batch.loss_mask.sum()), batch.num_sequences,
                                      dp_world_size=dp_world_size)


def close(got, want, ops=16):
    got = torch.as_tensor(got, dtype=F64)
    assert not bool(torch.isnan(got).any())
    assert_within(got, torch.as_tensor(want, dtype=F64), 2 * gamma(ops, F64) * max(abs(want), 1.0))


def test_dpo_sigmoid_loss_and_metrics():
    # beta 0.5: pair 0 margin 1.5 -> -log sigmoid(0.75); pair 1 margin 0 -> log 2; means over the 2 pairs
    batch, logp = pairs()
    settings = DpoLossSettings(beta=0.5, preference_loss_weight=0.75, sft_loss_weight=0.25)
    loss, metrics = settings.compute(logp, batch, normalizer(batch, dp_world_size=2))
    preference = (-math.log(1 / (1 + math.exp(-0.75))) + math.log(2.0)) / 2
    sft = (1.5 + 0.25) / 2
    close(loss, 2 * (0.75 * preference + 0.25 * sft))  # times dp_world_size
    want = {"dpo_loss": preference, "sft_loss": sft, "rewards_chosen": 0.5 * (0.5 + 0.0) / 2,
            "rewards_rejected": 0.5 * (-1.0 + 0.0) / 2, "reward_margin": 0.5 * (1.5 + 0.0) / 2,
            "preference_accuracy": (1.0 + 0.0) / 2}  # the tie of pair 1 is not a preference for the chosen
    assert set(metrics) == set(want)
    for name, value in want.items():
        close(metrics[name], value)


def test_dpo_gradient_by_hand():
    # d/d logp of -log sigmoid(beta (h_w - h_l)) = -beta (1 - sigmoid(beta * margin)) on chosen tokens, the
    # opposite on rejected ones; the pair mean halves it. Masked first tokens get nothing.
    batch, logp = pairs()
    loss, _ = DpoLossSettings(beta=0.5).compute(logp, batch, normalizer(batch))
    loss.backward()
    g0 = 0.5 * (1 - 1 / (1 + math.exp(-0.75))) / 2
    g1 = 0.5 * 0.5 / 2
    want = [0.0, -g0, -g0, 0.0, g0, 0.0, -g1, 0.0, g1, g1]
    assert not bool(logp.grad.isnan().any())
    assert_within(logp.grad, torch.tensor(want, dtype=F64), 2 * gamma(16, F64))


def test_ipo_with_mean_log_ratios():
    # beta 0.25: (margin - 1 / (2 beta))^2 = (margin - 2)^2 with the per-token means: pair 0 h_w 0.25, h_l -1
    # -> (1.25 - 2)^2 = 0.5625; pair 1 -> (0 - 2)^2 = 4; SFT term with the chosen NLL's mean: (0.75 + 0.25) / 2
    batch, logp = pairs()
    settings = DpoLossSettings(beta=0.25, loss_type="ipo", preference_average_log_probs=True,
                               sft_loss_weight=1.0, sft_average_log_probs=True)
    loss, metrics = settings.compute(logp, batch, normalizer(batch))
    assert metrics["dpo_loss"].item() == (0.5625 + 4.0) / 2
    assert metrics["sft_loss"].item() == 0.5
    assert loss.item() == (0.5625 + 4.0) / 2 + 0.5
    assert metrics["reward_margin"].item() == 0.25 * 1.25 / 2


def test_one_pair_is_its_own_mean():
    batch, logp = pairs(count=1)
    loss, metrics = DpoLossSettings(beta=0.5).compute(logp, batch, normalizer(batch))
    close(loss, -math.log(1 / (1 + math.exp(-0.75))))
    assert metrics["preference_accuracy"].item() == 1.0


def test_a_placeholder_micro_batch_contributes_zero_loss_and_gradient():
    batch = pack_sequences([{"input_ids": torch.arange(2), "loss_mask": torch.tensor([False, True]),
                             "ref_logprobs": torch.zeros(2, dtype=F64)}])
    logp = torch.tensor([-1.0, -2.0], dtype=F64, requires_grad=True)
    loss, metrics = DpoLossSettings().compute(logp, batch, LossNormalizer.from_counts("token_mean", 4, 4))
    loss.backward()
    assert loss.item() == 0.0 and metrics == {} and logp.grad.tolist() == [0.0, 0.0]


def test_dpo_needs_reference_logprobs():
    batch, logp = pairs()
    with pytest.raises(ValueError, match=r"^DPO needs the reference model's logprobs \(ref_logprobs\) on every "
                                         r"sequence$"):
        DpoLossSettings().compute(logp, batch.replace(ref_logprobs=None), normalizer(batch))


def test_dpo_settings_are_checked():
    with pytest.raises(ValueError, match=r"^dpo\.loss_type must be one of sigmoid, ipo, got 'hinge'$"):
        DpoLossSettings(loss_type="hinge")
    for beta in (0.0, -1.0):
        with pytest.raises(ValueError, match=rf"^dpo\.beta must be > 0, got {beta}$"):
            DpoLossSettings(beta=beta)
    for name in ("preference_loss_weight", "sft_loss_weight"):
        with pytest.raises(ValueError, match=rf"^dpo\.{name} must be >= 0, got -0.5$"):
            DpoLossSettings(**{name: -0.5})
        assert getattr(DpoLossSettings(**{name: 0.0}), name) == 0.0
    assert DpoLossSettings(beta=1e-9).beta == 1e-9


def test_sft_loss_is_the_mean_negative_logprob():
    # token_mean over the 6 loss tokens of the four sequences: (1 + 0.5 + 2 + 0.25 + 0.5 + 0.5) / 6
    batch, logp = pairs()
    loss, metrics = SftLossSettings().compute(logp, batch, normalizer(batch, dp_world_size=2))
    close(loss, 2 * 4.75 / 6)
    close(metrics["sft_loss"], 4.75 / 6)
    assert metrics["sft_tokens"].item() == 6.0 and set(metrics) == {"sft_loss", "sft_tokens"}
    loss.backward()
    assert logp.grad.tolist() == [0.0, -1 / 3, -1 / 3, 0.0, -1 / 3, 0.0, -1 / 3, 0.0, -1 / 3, -1 / 3]


def test_sft_loss_sequence_mean_on_a_packed_batch():
    # per sequence: 0.75, 2, 0.25, 0.5 -> summed over this micro-batch, over the mini-batch's 4 sequences
    batch, logp = pairs()
    settings = SftLossSettings(loss_reduction="sequence_mean")
    loss, _ = settings.compute(logp, batch, normalizer(batch, "sequence_mean"))
    close(loss, (0.75 + 2.0 + 0.25 + 0.5) / 4)


def test_sft_loss_checks_its_inputs():
    batch, logp = pairs()
    with pytest.raises(ValueError, match=r"^loss_mask has shape \(9,\) but logprobs has \(10,\)$"):
        compute_sft_loss(SftLossSettings(), logp, batch.loss_mask[1:], normalizer(batch))
    with pytest.raises(ValueError, match=r"^normalizer was built for 'sequence_mean' but the SFT loss reduction is "
                                         r"'token_mean'$"):
        compute_sft_loss(SftLossSettings(), logp, batch.loss_mask, normalizer(batch, "sequence_mean"))


def test_dpo_terms_match_torch_logsigmoid():
    # the same pairs through torch's logsigmoid of beta * margin, a second strategy for the sigmoid loss
    batch, logp = pairs()
    loss, _ = DpoLossSettings(beta=0.3).compute(logp, batch, normalizer(batch))
    margins = torch.tensor([1.5, 0.0], dtype=F64)
    close(loss, float(-F.logsigmoid(0.3 * margins).mean()))
