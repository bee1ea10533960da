"""Direct preference optimisation (DPO, Rafailov et al. 2023) and IPO (Azar et al. 2023), assembled once for every
backend like the policy's loss (`loss.py`).

A micro-batch holds whole pairs: sequence 2k is pair k's chosen response y_w, sequence 2k + 1 its rejected y_l, both
after the same prompt x (the pair planner keeps the two in one micro-batch). With the policy's and the frozen
reference model's summed response-token logprobs (the loss mask marks the response)::

    h_w = log pi(y_w | x) - log pi_ref(y_w | x),   h_l = log pi(y_l | x) - log pi_ref(y_l | x)
    sigmoid (DPO):  l = -log sigmoid(beta * (h_w - h_l))
    ipo:            l = (h_w - h_l - 1 / (2 * beta))^2
    loss = preference_loss_weight * mean over the mini-batch's pairs of l  +  sft_loss_weight * mean over pairs of
           NLL(y_w)

where NLL(y_w) is the chosen response's summed token NLL, or with `sft_average_log_probs` its mean (NeMo RL's
`preference_loss_weight`, `sft_loss_weight`, `sft_average_log_probs`, with their meanings there). With
`preference_average_log_probs` h is the mean over the response's tokens instead of the sum (NeMo RL's key; IPO's
length normalisation). Metrics (means over pairs): rewards_chosen = beta * h_w, rewards_rejected = beta * h_l,
reward margin, preference accuracy (h_w > h_l).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rl.core.algorithms.reduction import LossNormalizer
from rl.core.algorithms.segments import segment_sum
from rl.core.algorithms.sft_loss import SupervisedLossSettings

DPO_LOSS_TYPES = ("sigmoid", "ipo")


@dataclass(frozen=True)
class DpoLossSettings(SupervisedLossSettings):
    """The `dpo:` block's loss keys (`rl.core.config.supervised.DpoConfig`), with its defaults."""

    beta: float = 0.1
    loss_type: str = "sigmoid"
    preference_loss_weight: float = 1.0
    sft_loss_weight: float = 0.0
    sft_average_log_probs: bool = False
    preference_average_log_probs: bool = False

    def __post_init__(self) -> None:
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"dpo.loss_type must be one of {', '.join(DPO_LOSS_TYPES)}, got {self.loss_type!r}")
        if not self.beta > 0:
            raise ValueError(f"dpo.beta must be > 0, got {self.beta}")
        for name in ("preference_loss_weight", "sft_loss_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"dpo.{name} must be >= 0, got {getattr(self, name)}")

    def compute(self, logprobs: Tensor, batch, normalizer: LossNormalizer) -> tuple[Tensor, dict[str, Tensor]]:
        return compute_dpo_loss(self, logprobs, batch.ref_logprobs, batch.loss_mask, batch.token_seq_ids(),
                                batch.num_sequences, normalizer)


def pair_count(normalizer: LossNormalizer) -> float:
    """Pairs in the mini-batch: half its sequences with a loss token (every sequence of a pair has one)."""
    return max(normalizer.num_sequences / 2.0, 1.0)


def sequence_sums(values: Tensor, mask: Tensor, seq_ids: Tensor, num_sequences: int) -> tuple[Tensor, Tensor]:
    """(per-sequence sum of `values` over the mask, per-sequence mask count)."""
    weights = mask.to(values.dtype)
    return (segment_sum(torch.where(mask.bool(), values, 0.0), seq_ids, num_sequences),
            segment_sum(weights, seq_ids, num_sequences))


def preference_terms(settings: DpoLossSettings, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor,
                     seq_ids: Tensor, num_sequences: int) -> dict[str, Tensor]:
    """Per pair: `h_w`, `h_l` (log-ratios), `loss` (the preference loss l) and `nll_w` (chosen's NLL, summed or
    with `sft_average_log_probs` averaged over its tokens)."""
    sums, counts = sequence_sums(logprobs - ref_logprobs, mask, seq_ids, num_sequences)
    nll, _ = sequence_sums(-logprobs, mask, seq_ids, num_sequences)
    counts = counts.clamp(min=1)
    ratios = sums / counts if settings.preference_average_log_probs else sums
    h_w, h_l = ratios[0::2], ratios[1::2]
    margin = h_w - h_l
    if settings.loss_type == "sigmoid":
        loss = -F.logsigmoid(settings.beta * margin)
    else:
        loss = (margin - 1.0 / (2.0 * settings.beta)) ** 2
    nll_w = nll[0::2] / counts[0::2] if settings.sft_average_log_probs else nll[0::2]
    return {"h_w": h_w, "h_l": h_l, "loss": loss, "nll_w": nll_w}


def compute_dpo_loss(settings: DpoLossSettings, logprobs: Tensor, ref_logprobs: Tensor | None, loss_mask: Tensor,
                     seq_ids: Tensor, num_sequences: int, normalizer: LossNormalizer
                     ) -> tuple[Tensor, dict[str, Tensor]]:
    """Micro-batch loss (its pairs' share of the mini-batch loss, times dp_world_size) and its share of the
    mini-batch metrics: dpo_loss (preference term), sft_loss (chosen NLL term, unweighted), rewards_chosen,
    rewards_rejected, reward_margin, preference_accuracy."""
    if num_sequences % 2:  # a placeholder micro-batch (a rank without pairs): nothing in the loss
        zero = logprobs.sum() * 0.0
        return zero, {}
    if ref_logprobs is None:
        raise ValueError("DPO needs the reference model's logprobs (ref_logprobs) on every sequence")
    terms = preference_terms(settings, logprobs, ref_logprobs, loss_mask, seq_ids, num_sequences)
    pairs = pair_count(normalizer)
    preference = terms["loss"].sum() / pairs
    sft = terms["nll_w"].sum() / pairs
    loss = settings.preference_loss_weight * preference
    if settings.sft_loss_weight:
        loss = loss + settings.sft_loss_weight * sft
    beta = settings.beta
    metrics = {"dpo_loss": preference.detach(), "sft_loss": sft.detach(),
               "rewards_chosen": (beta * terms["h_w"]).detach().sum() / pairs,
               "rewards_rejected": (beta * terms["h_l"]).detach().sum() / pairs,
               "reward_margin": (beta * (terms["h_w"] - terms["h_l"])).detach().sum() / pairs,
               "preference_accuracy": (terms["h_w"] > terms["h_l"]).float().sum() / pairs}
    return loss * normalizer.dp_world_size, metrics
