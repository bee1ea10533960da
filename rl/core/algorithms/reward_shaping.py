"""DAPO's reward-side tools as pure functions: which GRPO groups carry signal (dynamic sampling), the soft
overlong penalty, and pass@k / mean@k over k samples per prompt."""

from __future__ import annotations

import torch
from torch import Tensor


def groups_with_signal(rewards: Tensor, group_size: int) -> Tensor:
    """[G] bool: whether the `group_size` consecutive rewards of group g are not all equal (a group of one always
    counts: there is nothing to compare it with)."""
    if group_size == 1:
        return torch.ones(rewards.numel(), dtype=torch.bool)
    groups = rewards.reshape(-1, group_size)
    return groups.amax(1) > groups.amin(1)


def zero_variance_samples(rewards: Tensor, group_index: Tensor, tol: float, live: Tensor | None = None) -> Tensor:
    """[B] bool: the samples of prompts (by `group_index`) with more than one live sample whose live rewards spread
    by at most `tol` (max - min), as SkyRL's zero_variance_filter drops them; `live` (default all): the samples still
    in the loss, so that one masked before (e.g. cut by the length budget) neither makes a group vary nor counts."""
    live = torch.ones(rewards.shape, dtype=torch.bool) if live is None else live
    groups, position = torch.unique(group_index, return_inverse=True)
    values = rewards.double()
    high = torch.full((len(groups),), -torch.inf, dtype=torch.float64).scatter_reduce(
        0, position[live], values[live], "amax")
    low = torch.full((len(groups),), torch.inf, dtype=torch.float64).scatter_reduce(
        0, position[live], values[live], "amin")
    counts = torch.zeros(len(groups), dtype=torch.long).scatter_add(0, position[live], torch.ones_like(position[live]))
    return ((counts > 1) & (high - low <= tol))[position]


def overlong_penalty(lengths: Tensor, max_length: int, band: int, factor: float) -> Tensor:
    """[B] reward added to responses of `lengths` tokens (<= 0): nothing up to max_length - band, then a linear
    ramp to -factor at max_length (DAPO's soft overlong punishment). band 0 gives zeros."""
    if band <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    excess = (lengths.float() - (max_length - band)).clamp(min=0) / band
    return -excess.clamp(max=1.0) * factor


def pass_and_mean_at_k(rewards: Tensor, k: int) -> tuple[float, float]:
    """(pass@k, mean@k) of rewards ordered prompt-major, k per prompt: the share of prompts with a sample whose
    reward is > 0, and the mean reward."""
    groups = rewards.reshape(-1, k)
    return float((groups > 0).any(1).float().mean()), float(groups.float().mean())
