"""The trainer-vs-rollout gap of one rollout batch, and the off-policy corrections applied to its sequences
(`rl.core.algorithms.off_policy`; `trainer.algorithm.off_policy_correction`)."""

from __future__ import annotations

import torch

from rl.core.algorithms.off_policy import correct, correction_enabled, mismatch_metrics
from rl.trainer.experience import Experience


def skips_old_logprob_pass(cfg, on_policy: bool) -> bool:
    """With one optimizer step per batch, the training forward's logprobs are the behaviour policy's only when the
    engine samples with the trainer's own numerics (the HF engine) and nothing corrects for a gap; otherwise the
    old logprobs get their own pass, so the gap is measured and (when asked) corrected."""
    return (on_policy and cfg.generator.backend == "hf"
            and not correction_enabled(cfg.trainer.algorithm.off_policy_correction))


def measure_and_correct(experience: Experience, correction) -> dict[str, float]:
    """Metrics of the gap between `rollout_logprobs` and `old_logprobs` over the loss tokens; with a correction on,
    each sequence's advantages are scaled by its TIS weights and rejected tokens leave its loss mask. Nothing
    without old logprobs (the on-policy shortcut)."""
    sequences = experience.sequences
    if not sequences or "old_logprobs" not in sequences[0] or "rollout_logprobs" not in sequences[0]:
        return {}
    lengths = [len(seq["loss_mask"]) for seq in sequences]
    seq_ids = torch.repeat_interleave(torch.arange(len(sequences)), torch.tensor(lengths))
    old, rollout, mask = (torch.cat([seq[name] for seq in sequences]).float() for name in
                          ("old_logprobs", "rollout_logprobs", "loss_mask"))
    mask = mask.bool()
    metrics = mismatch_metrics(old, rollout, mask)
    if correction_enabled(correction):
        weight, kept, found = correct(correction, old, rollout, mask, seq_ids, len(sequences))
        metrics.update(found)
        for seq, w, m in zip(sequences, weight.split(lengths), kept.split(lengths), strict=True):
            seq["advantages"] = seq["advantages"] * w
            seq["loss_mask"] = m
    return metrics


def anchor_on_rollout(experience: Experience) -> None:
    """For a loss whose ratio is to the engine's logprobs (`rollout_is`): each sequence's rollout logprobs become
    the old logprobs the workers' loss reads, once the gap to the trainer's own was measured (and corrected)."""
    for seq in experience.sequences:
        seq["old_logprobs"] = seq["rollout_logprobs"]
