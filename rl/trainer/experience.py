"""From rollouts to training sequences: rewards, advantages, and per-token fields aligned with target tokens.

`build_experience` lays out the sequences; `assign_advantages` fills in the advantages (and a critic's returns)
once what they depend on is known: the critic's values (`gae`) and the per-token rewards (a KL penalty in the
reward) come from forward passes over those sequences."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rl.core.algorithms import compute_advantages
from rl.core.algorithms.reward_shaping import zero_variance_samples


@dataclass
class Experience:
    """One rollout batch ready for training: `sequences` feed `pack_sequences`/`pad_sequences`."""

    sequences: list[dict[str, Tensor]]
    rewards: Tensor  # [B]
    response_lengths: Tensor  # [B]
    prompt_lengths: Tensor | None = None  # [B]
    group_index: Tensor | None = None  # [B]: each response's prompt

    def responses(self, field: str) -> Tensor:
        """[B, T] the response part of a per-token field, right-padded with zeros (T = the longest response)."""
        out = torch.zeros(len(self.sequences), int(self.response_lengths.max()) if len(self.sequences) else 0)
        for b, (seq, start, length) in enumerate(zip(self.sequences, self.prompt_lengths.tolist(),
                                                     self.response_lengths.tolist(), strict=True)):
            out[b, :length] = seq[field][start:start + length]
        return out

    def set_responses(self, field: str, values: Tensor) -> None:
        """Writes [B, T] response values into each sequence's per-token `field` (zero on prompt tokens)."""
        for b, (seq, start, length) in enumerate(zip(self.sequences, self.prompt_lengths.tolist(),
                                                     self.response_lengths.tolist(), strict=True)):
            whole = torch.zeros(len(seq["input_ids"]))
            whole[start:start + length] = values[b, :length]
            seq[field] = whole


def response_mask(lengths: Tensor) -> Tensor:
    """[B, T] bool: the first lengths[b] entries of row b."""
    width = int(lengths.max().item()) if lengths.numel() else 0
    return torch.arange(width)[None, :] < lengths[:, None]


def build_experience(rollouts: Sequence, rewards: Tensor, estimator: str | None = None, norm_by_std: bool = True,
                     gamma: float = 1.0, lambd: float = 1.0, overlong_filtering: bool = False) -> Experience:
    """Each sequence is prompt + response with the loss on response tokens (on the policy's own tokens only for
    multi-turn episodes, `multi_turn.Trajectory.response_mask`); with `estimator`, its advantages too
    (`assign_advantages`). `overlong_filtering` (DAPO): a response cut by the length budget keeps no loss token
    (its reward still counts in its group's baseline)."""
    sequences = []
    for rollout in rollouts:
        prompt, response = len(rollout.prompt_ids), len(rollout.response_ids)
        loss_mask = torch.zeros(prompt + response, dtype=torch.bool)
        if not (overlong_filtering and rollout.finish_reason == "length"):
            # a multi-turn episode's observations are not the policy's: no loss on them
            policy = getattr(rollout, "response_mask", None)
            loss_mask[prompt:] = True if policy is None else torch.tensor(policy, dtype=torch.bool)
        rollout_lp = torch.zeros(prompt + response)
        rollout_lp[prompt:] = torch.tensor(rollout.rollout_logprobs, dtype=torch.float32)
        sequences.append({
            "input_ids": torch.tensor(list(rollout.prompt_ids) + list(rollout.response_ids), dtype=torch.long),
            "loss_mask": loss_mask, "rollout_logprobs": rollout_lp,
        })
    if any(getattr(rollout, "images", None) is not None for rollout in rollouts):  # a vision-language model's
        for sequence, rollout in zip(sequences, rollouts, strict=True):
            sequence["images"] = rollout.images
    experience = Experience(sequences=sequences, rewards=rewards,
                            response_lengths=torch.tensor([len(r.response_ids) for r in rollouts]),
                            prompt_lengths=torch.tensor([len(r.prompt_ids) for r in rollouts]),
                            group_index=torch.tensor([r.prompt_index for r in rollouts]))
    if estimator is not None:
        assign_advantages(experience, estimator, norm_by_std, gamma, lambd)
    return experience


def mask_zero_variance_groups(experience: Experience, tol: float) -> dict[str, float]:
    """trainer.algorithm.zero_variance_filter (SkyRL's): the samples of a prompt whose rewards do not vary leave the
    loss (before advantages, so they leave its statistics too); returns the share of prompts masked."""
    live = torch.tensor([bool(seq["loss_mask"].any()) for seq in experience.sequences])
    masked = zero_variance_samples(experience.rewards, experience.group_index, tol, live)
    for seq, drop in zip(experience.sequences, masked.tolist(), strict=True):
        if drop:
            seq["loss_mask"] = torch.zeros_like(seq["loss_mask"])
    groups = experience.group_index
    return {"zero_variance_groups": len(set(groups[masked].tolist())) / max(len(set(groups.tolist())), 1)}


def assign_advantages(experience: Experience, estimator: str, norm_by_std: bool, gamma: float = 1.0,
                      lambd: float = 1.0, token_rewards: Tensor | None = None) -> dict[str, float]:
    """Per response token advantages (and, for `gae`, the critic's returns from its `old_values`).
    `token_rewards` [B, T]: every response token's reward, the outcome's included on the last token (given when the
    reward has a per-token part, the KL penalty in the reward); the estimators then read them instead of `rewards`.
    Returns the critic's metrics (explained variance of its values) for `gae`, else nothing."""
    # the policy's own tokens (the loss mask before any off-policy correction): returns skip observation spans
    mask = experience.responses("loss_mask").bool()
    values = experience.responses("old_values") if estimator == "gae" else None
    options = {"norm_by_std": norm_by_std, "gamma": gamma, "lambd": lambd, "values": values}
    if token_rewards is not None:
        options["token_rewards"] = token_rewards
    advantages, returns = compute_advantages(estimator, experience.rewards, mask, experience.group_index, **options)
    experience.set_responses("advantages", advantages)
    if values is None:
        return {}
    experience.set_responses("returns", returns)
    from rl.core.algorithms.value_loss import explained_variance

    return {"explained_variance": explained_variance(values, returns, mask)}
