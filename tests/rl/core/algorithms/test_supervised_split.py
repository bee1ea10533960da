"""The SFT and DPO losses are each micro-batch's share of the mini-batch loss: four preference pairs (or four
conversations) in one packed micro-batch give the same loss and the same gradient with respect to the token
logprobs as the same sequences split into two micro-batches whose losses are added, within float64 rounding; a
micro-batch without whole pairs (a rank's placeholder) contributes nothing."""

import torch

from rl.core.algorithms import LossNormalizer
from rl.core.algorithms.dpo_loss import DpoLossSettings
from rl.core.algorithms.sft_loss import SftLossSettings
from rl.core.packing import pack_sequences
from tests.testing import tolerances

F64 = torch.float64


def _sequences():
    g = torch.Generator().manual_seed(3)
    out = []
    for n in (5, 7, 6, 4, 8, 5, 9, 6):
        out.append({"input_ids": torch.randint(1, 20, (n,), generator=g), "loss_mask": torch.arange(n) >= 2,
                    "ref_logprobs": -torch.rand(n, generator=g, dtype=F64)})
    return out


def _loss_and_grad(settings, batches, logprobs, normalizer):
    total, grads = 0.0, []
    for batch, lp in zip(batches, logprobs, strict=True):
        lp = lp.clone().requires_grad_(True)
        loss, _ = settings.compute(lp, batch, normalizer)
        loss.backward()
        total += float(loss)
        grads.append(lp.grad)
    return total, torch.cat(grads)


def test_one_micro_batch_equals_two():
    seqs = _sequences()
    g = torch.Generator().manual_seed(4)
    logprobs = [-torch.rand(len(s["input_ids"]), generator=g, dtype=F64) for s in seqs]
    normalizer = LossNormalizer.from_counts("token_mean", sum(int(s["loss_mask"].sum()) for s in seqs), len(seqs))
    for settings in (SftLossSettings(), DpoLossSettings(beta=0.3, sft_loss_weight=0.5),
                     DpoLossSettings(beta=0.3, loss_type="ipo", preference_average_log_probs=True)):
        whole = _loss_and_grad(settings, [pack_sequences(seqs)], [torch.cat(logprobs)], normalizer)
        halves = _loss_and_grad(settings, [pack_sequences(seqs[:4]), pack_sequences(seqs[4:])],
                                [torch.cat(logprobs[:4]), torch.cat(logprobs[4:])], normalizer)
        bound = 2 * tolerances.gamma(sum(len(s["input_ids"]) for s in seqs), F64)
        tolerances.assert_within(torch.tensor(halves[0]), torch.tensor(whole[0]), bound * abs(whole[0]), "loss")
        tolerances.assert_within(halves[1], whole[1], bound * float(whole[1].abs().max()), "gradient")


def test_a_placeholder_micro_batch_adds_nothing():
    placeholder = pack_sequences([{"input_ids": torch.zeros(2, dtype=torch.long),
                                   "loss_mask": torch.zeros(2, dtype=torch.bool)}])
    normalizer = LossNormalizer.from_counts("token_mean", 10, 4)
    lp = torch.zeros(2, requires_grad=True)
    loss, metrics = DpoLossSettings().compute(lp, placeholder, normalizer)
    assert float(loss) == 0.0 and metrics == {}


def test_loss_weights_and_the_sft_terms_average_follow_nemo_rl():
    """NeMo RL's DPOLossFn: preference_loss_weight * mean over pairs of -log sigmoid(beta * (h_w - h_l)) +
    sft_loss_weight * mean over pairs of the chosen response's NLL, summed over its tokens, or averaged over them
    with sft_average_log_probs; written out here per pair from the sequences."""
    seqs = _sequences()
    g = torch.Generator().manual_seed(6)
    logprobs = [-torch.rand(len(s["input_ids"]), generator=g, dtype=F64) for s in seqs]
    normalizer = LossNormalizer.from_counts("token_mean", sum(int(s["loss_mask"].sum()) for s in seqs), len(seqs))
    batch = pack_sequences(seqs)
    for average in (False, True):
        settings = DpoLossSettings(beta=0.3, preference_loss_weight=0.7, sft_loss_weight=0.2,
                                   sft_average_log_probs=average)
        want = []
        for k in range(0, len(seqs), 2):
            mask_w, mask_l = seqs[k]["loss_mask"], seqs[k + 1]["loss_mask"]
            h_w = ((logprobs[k] - seqs[k]["ref_logprobs"]) * mask_w).sum()
            h_l = ((logprobs[k + 1] - seqs[k + 1]["ref_logprobs"]) * mask_l).sum()
            nll = -(logprobs[k] * mask_w).sum() / (mask_w.sum() if average else 1)
            want.append(0.7 * -torch.nn.functional.logsigmoid(0.3 * (h_w - h_l)) + 0.2 * nll)
        want = torch.stack(want).mean()
        loss, _ = settings.compute(torch.cat(logprobs), batch, normalizer)
        bound = 4 * tolerances.gamma(sum(len(s["input_ids"]) for s in seqs), F64) * float(abs(want))
        tolerances.assert_within(loss.detach(), want, bound, f"loss (sft_average_log_probs={average})")
