"""Advantage estimators for outcome rewards, registered by name in `ADVANTAGE_ESTIMATORS`.

Every estimator has the same signature, so the trainer picks one by name without branching::

    fn(rewards[B], response_mask[B, T], group_index[B] | None, *,
       norm_by_std=True, epsilon=1e-6, values=None, gamma=1.0, lambd=1.0) -> (advantages[B, T], returns[B, T])

- `rewards`: one scalar outcome reward per response.
- `response_mask`: 1 on the response tokens of each row (right-padded); the outcome reward sits on the last one.
- `group_index`: integer id of each response's prompt; responses with the same id form a group (grpo, rloo).
- `norm_by_std` / `epsilon`: grpo only. `values` / `lambd`: gae only. `gamma`: gae and reinforce++.

Both outputs are zero outside `response_mask`. Groups are reduced with `torch.unique` + `index_add`; the
reverse-time recursions (reinforce++, gae) loop over T, batched over B.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl.core.registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")

WHITEN_EPS = 1e-8


def _check_inputs(rewards: Tensor, response_mask: Tensor, group_index: Tensor | None, needs_groups: bool) -> None:
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, T], got shape {tuple(response_mask.shape)}")
    if rewards.shape != response_mask.shape[:1]:
        raise ValueError(
            f"rewards must be [B] with B={response_mask.shape[0]} (one per response), got {tuple(rewards.shape)}"
        )
    if needs_groups and group_index is None:
        raise ValueError("group_index is required: pass the prompt id of every response")
    if group_index is not None and group_index.shape != rewards.shape:
        raise ValueError(f"group_index must be [B]={tuple(rewards.shape)}, got {tuple(group_index.shape)}")


def group_statistics(rewards: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-response (group mean, unbiased group std, group size) and the per-response group position."""
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    counts_f = counts.to(rewards.dtype)
    mean = rewards.new_zeros(counts.numel()).index_add(0, inverse, rewards) / counts_f
    centered = rewards - mean[inverse]
    sq = rewards.new_zeros(counts.numel()).index_add(0, inverse, centered * centered)
    std = torch.sqrt(sq / (counts_f - 1).clamp(min=1))
    return mean[inverse], std[inverse], counts[inverse], inverse


def masked_whiten(values: Tensor, mask: Tensor) -> Tensor:
    """(values - mean) / sqrt(var + 1e-8) over the masked entries, with the unbiased variance (as veRL)."""
    weights = mask.to(values.dtype)
    count = weights.sum()
    if count.item() < 2:
        raise ValueError(f"whitening needs at least 2 valid tokens in response_mask, got {int(count.item())}")
    mean = (values * weights).sum() / count
    var = (((values - mean) ** 2) * weights).sum() / (count - 1)
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS)


def last_token_rewards(rewards: Tensor, response_mask: Tensor) -> Tensor:
    """[B, T] tensor holding each row's reward on its last valid token and zeros elsewhere."""
    steps = torch.arange(response_mask.shape[1], device=response_mask.device)
    last = torch.where(response_mask.bool(), steps, -1).max(dim=1).values
    token_rewards = rewards.new_zeros(response_mask.shape)
    has_token = (last >= 0).to(rewards.dtype)
    return token_rewards.scatter(1, last.clamp(min=0).unsqueeze(1), (rewards * has_token).unsqueeze(1))


def _broadcast(scores: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    advantages = scores.unsqueeze(1) * response_mask.to(scores.dtype)
    return advantages, advantages.clone()


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(
    rewards, response_mask, group_index=None, *, norm_by_std=True, epsilon=1e-6, values=None, gamma=1.0, lambd=1.0
):
    """(r - group mean) [/ (group std + epsilon)]; a group of one uses mean 0 and std 1 (as veRL)."""
    _check_inputs(rewards, response_mask, group_index, needs_groups=True)
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    mean, std, size, _ = group_statistics(rewards, group_index)
    single = size == 1
    mean = torch.where(single, 0.0, mean)
    std = torch.where(single, 1.0, std)
    scores = (rewards - mean) / (std + epsilon) if norm_by_std else rewards - mean
    return _broadcast(scores, response_mask)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(
    rewards, response_mask, group_index=None, *, norm_by_std=True, epsilon=1e-6, values=None, gamma=1.0, lambd=1.0
):
    """Leave-one-out baseline: r_i - mean_{j != i} r_j = (r_i - group mean) * n / (n - 1)."""
    _check_inputs(rewards, response_mask, group_index, needs_groups=True)
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    mean, _, size, _ = group_statistics(rewards, group_index)
    if bool((size < 2).any()):
        lonely = sorted({int(g) for g in group_index[size < 2].tolist()})
        raise ValueError(
            f"rloo needs at least 2 responses per prompt; group_index values {lonely[:10]} have a single response. "
            "Set generator.n_samples_per_prompt >= 2"
        )
    n = size.to(rewards.dtype)
    return _broadcast((rewards - mean) * n / (n - 1), response_mask)


@ADVANTAGE_ESTIMATORS.register("reinforce++")
def reinforce_plus_plus(
    rewards, response_mask, group_index=None, *, norm_by_std=True, epsilon=1e-6, values=None, gamma=1.0, lambd=1.0
):
    """Discounted reward-to-go of the last-token reward, whitened over the batch's valid tokens (as veRL)."""
    _check_inputs(rewards, response_mask, group_index, needs_groups=False)
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    mask = response_mask.to(rewards.dtype)
    token_rewards = last_token_rewards(rewards, response_mask)
    returns = torch.zeros_like(token_rewards)
    running = rewards.new_zeros(rewards.shape)
    for t in reversed(range(mask.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    advantages = masked_whiten(returns, response_mask) * mask
    return advantages, returns * mask


@ADVANTAGE_ESTIMATORS.register("gae")
def gae(rewards, response_mask, group_index=None, *, norm_by_std=True, epsilon=1e-6, values=None, gamma=1.0, lambd=1.0):
    """Token-level GAE on the last-token reward; returns = advantages + values; advantages whitened (as veRL)."""
    _check_inputs(rewards, response_mask, group_index, needs_groups=False)
    if values is None or values.shape != response_mask.shape:
        got = None if values is None else tuple(values.shape)
        raise ValueError(f"gae needs critic values of shape {tuple(response_mask.shape)}, got {got}")
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    mask = response_mask.to(values.dtype)
    token_rewards = last_token_rewards(rewards.to(values.dtype), response_mask)
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(values.shape[0])
    last_gae = values.new_zeros(values.shape[0])
    for t in reversed(range(mask.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        step_gae = delta + gamma * lambd * last_gae
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        last_gae = step_gae * mask[:, t] + (1 - mask[:, t]) * last_gae
        advantages[:, t] = last_gae
    returns = (advantages + values) * mask
    return masked_whiten(advantages, response_mask) * mask, returns


def compute_advantages(
    estimator: str, rewards: Tensor, response_mask: Tensor, group_index: Tensor | None = None, **options
) -> tuple[Tensor, Tensor]:
    """Look up `estimator` in ADVANTAGE_ESTIMATORS and run it; `options` are the shared keyword arguments."""
    return ADVANTAGE_ESTIMATORS.get(estimator)(rewards, response_mask, group_index, **options)
