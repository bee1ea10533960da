"""From rollouts to training sequences: rewards, advantages, and per-token fields aligned with target tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rl.core.algorithms import compute_advantages


@dataclass
class Experience:
    """One rollout batch ready for training: `sequences` feed `pack_sequences`/`pad_sequences`."""

    sequences: list[dict[str, Tensor]]
    rewards: Tensor  # [B]
    response_lengths: Tensor  # [B]


def response_mask(lengths: Tensor) -> Tensor:
    """[B, T] bool: the first lengths[b] entries of row b."""
    width = int(lengths.max().item()) if lengths.numel() else 0
    return torch.arange(width)[None, :] < lengths[:, None]


def build_experience(rollouts: Sequence, rewards: Tensor, estimator: str, norm_by_std: bool,
                     gamma: float = 1.0, lambd: float = 1.0, overlong_filtering: bool = False) -> Experience:
    """Advantages per response token; each sequence is prompt + response with the loss on response tokens (on the
    policy's own tokens only for multi-turn episodes, `multi_turn.Trajectory.response_mask`).
    `overlong_filtering` (DAPO): a response cut by the length budget keeps no loss token (its reward still
    counts in its group's baseline)."""
    lengths = torch.tensor([len(r.response_ids) for r in rollouts])
    mask = response_mask(lengths)
    group = torch.tensor([r.prompt_index for r in rollouts])
    advantages, _ = compute_advantages(estimator, rewards, mask, group, norm_by_std=norm_by_std, gamma=gamma,
                                       lambd=lambd)
    sequences = []
    for b, rollout in enumerate(rollouts):
        prompt, response = len(rollout.prompt_ids), len(rollout.response_ids)
        total = prompt + response
        loss_mask = torch.zeros(total, dtype=torch.bool)
        if not (overlong_filtering and rollout.finish_reason == "length"):
            # a multi-turn episode's observations are not the policy's: no loss on them
            policy = getattr(rollout, "response_mask", None)
            loss_mask[prompt:] = True if policy is None else torch.tensor(policy, dtype=torch.bool)
        token_adv = torch.zeros(total)
        token_adv[prompt:] = advantages[b, :response]
        rollout_lp = torch.zeros(total)
        rollout_lp[prompt:] = torch.tensor(rollout.rollout_logprobs, dtype=torch.float32)
        sequences.append({
            "input_ids": torch.tensor(list(rollout.prompt_ids) + list(rollout.response_ids), dtype=torch.long),
            "loss_mask": loss_mask, "advantages": token_adv, "rollout_logprobs": rollout_lp,
        })
    return Experience(sequences=sequences, rewards=rewards, response_lengths=lengths)
