"""Advantage estimators for outcome rewards, registered by name in `ADVANTAGE_ESTIMATORS`.

Every estimator has the same signature, so the trainer picks one by name without branching::

    fn(rewards[B], response_mask[B, T], group_index[B] | None, *, norm_by_std=True, epsilon=1e-6, values=None,
       gamma=1.0, lambd=1.0, token_rewards=None) -> (advantages[B, T], returns[B, T])

- `rewards`: one scalar outcome reward per response.
- `response_mask`: 1 on the tokens the policy wrote (right-padded; 0 on the observations of multi-turn episodes,
  whose spans the reverse-time recursions step over); the outcome reward sits on the last token it marks.
- `group_index`: integer id of each response's prompt; responses with the same id form a group (grpo, rloo).
- `norm_by_std` / `epsilon`: grpo only. `values` / `lambd`: gae only. `gamma`: gae and reinforce++.
- `token_rewards`: optional [B, T] reward of every token, zero on padding (the outcome on the last token plus a
  per-token part such as a KL penalty); it replaces ``last_token_rewards(rewards, response_mask)``: grpo and rloo
  score a response by its row sum (as veRL and SkyRL do), reinforce++, gae and no_op read it per token.

Both outputs are zero outside `response_mask`. Groups are reduced with `torch.unique` + `index_add`; the
reverse-time recursions (reinforce++, gae) loop over T, batched over B.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl.core.registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")

WHITEN_EPS = 1e-8


def _check_inputs(
    rewards: Tensor,
    response_mask: Tensor,
    group_index: Tensor | None,
    needs_groups: bool,
    token_rewards: Tensor | None = None,
) -> None:
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
    if token_rewards is not None and token_rewards.shape != response_mask.shape:
        raise ValueError(
            f"token_rewards must be [B, T]={tuple(response_mask.shape)} like response_mask, got "
            f"{tuple(token_rewards.shape)}"
        )


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


def _float(rewards: Tensor) -> Tensor:
    return rewards.to(torch.promote_types(rewards.dtype, torch.float32))


def _outcomes(rewards: Tensor, token_rewards: Tensor | None) -> Tensor:
    """One score per response: `rewards`, or the row sums of `token_rewards` when given."""
    return _float(rewards if token_rewards is None else token_rewards.sum(dim=1))


def _per_token(rewards: Tensor, response_mask: Tensor, token_rewards: Tensor | None) -> Tensor:
    """[B, T] rewards: `token_rewards` when given, else each outcome on its row's last masked token."""
    return _float(token_rewards) if token_rewards is not None else last_token_rewards(_float(rewards), response_mask)


def _broadcast(scores: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    advantages = scores.unsqueeze(1) * response_mask.to(scores.dtype)
    return advantages, advantages.clone()


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo(
    rewards,
    response_mask,
    group_index=None,
    *,
    norm_by_std=True,
    epsilon=1e-6,
    values=None,
    gamma=1.0,
    lambd=1.0,
    token_rewards=None,
):
    """(r - group mean) [/ (group std + epsilon)]; a group of one uses mean 0 and std 1 (as veRL)."""
    _check_inputs(rewards, response_mask, group_index, True, token_rewards)
    rewards = _outcomes(rewards, token_rewards)
    mean, std, size, _ = group_statistics(rewards, group_index)
    single = size == 1
    mean = torch.where(single, 0.0, mean)
    std = torch.where(single, 1.0, std)
    scores = (rewards - mean) / (std + epsilon) if norm_by_std else rewards - mean
    return _broadcast(scores, response_mask)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(
    rewards,
    response_mask,
    group_index=None,
    *,
    norm_by_std=True,
    epsilon=1e-6,
    values=None,
    gamma=1.0,
    lambd=1.0,
    token_rewards=None,
):
    """Leave-one-out baseline: r_i - mean_{j != i} r_j = (r_i - group mean) * n / (n - 1)."""
    _check_inputs(rewards, response_mask, group_index, True, token_rewards)
    rewards = _outcomes(rewards, token_rewards)
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
    rewards,
    response_mask,
    group_index=None,
    *,
    norm_by_std=True,
    epsilon=1e-6,
    values=None,
    gamma=1.0,
    lambd=1.0,
    token_rewards=None,
):
    """Discounted reward-to-go over the policy's tokens, whitened over the batch's masked tokens (as veRL).

    G_t = r_t + gamma * G_next on masked tokens, G_next being the return of the next masked token of the row; an
    unmasked span (an observation between turns) passes the running return through undiscounted and gets 0, so
    an outcome reward reaches every earlier turn (veRL since its PR 7300, which fixed a reset at every 0).
    """
    _check_inputs(rewards, response_mask, group_index, False, token_rewards)
    token_rewards = _per_token(rewards, response_mask, token_rewards)
    mask = response_mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = token_rewards.new_zeros(token_rewards.shape[0])
    for t in reversed(range(mask.shape[1])):
        step = token_rewards[:, t] + gamma * running
        returns[:, t] = step * mask[:, t]
        running = torch.where(response_mask[:, t].bool(), step, running)
    advantages = masked_whiten(returns, response_mask) * mask
    return advantages, returns


@ADVANTAGE_ESTIMATORS.register("gae")
def gae(
    rewards,
    response_mask,
    group_index=None,
    *,
    norm_by_std=True,
    epsilon=1e-6,
    values=None,
    gamma=1.0,
    lambd=1.0,
    token_rewards=None,
):
    """Token-level GAE on the token rewards; returns = advantages + values; advantages whitened (as veRL).
    Unmasked spans carry the next value and the running GAE through unchanged."""
    _check_inputs(rewards, response_mask, group_index, False, token_rewards)
    if values is None or values.shape != response_mask.shape:
        got = None if values is None else tuple(values.shape)
        raise ValueError(f"gae needs critic values of shape {tuple(response_mask.shape)}, got {got}")
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    mask = response_mask.to(values.dtype)
    token_rewards = _per_token(rewards, response_mask, token_rewards).to(values.dtype)
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


@ADVANTAGE_ESTIMATORS.register("no_op")
def no_op(
    rewards,
    response_mask,
    group_index=None,
    *,
    norm_by_std=True,
    epsilon=1e-6,
    values=None,
    gamma=1.0,
    lambd=1.0,
    token_rewards=None,
):
    """Advantages = returns = the token rewards as given, masked (SkyRL's `no_op`); without `token_rewards`, each
    outcome on its row's last masked token. On-policy distillation gives as token rewards the negative reverse KL
    to the teacher (`use_kl_in_reward`), which needs no baseline or whitening."""
    _check_inputs(rewards, response_mask, group_index, False, token_rewards)
    token_rewards = _per_token(rewards, response_mask, token_rewards)
    advantages = token_rewards * response_mask.to(token_rewards.dtype)
    return advantages, advantages.clone()


def compute_advantages(
    estimator: str, rewards: Tensor, response_mask: Tensor, group_index: Tensor | None = None, **options
) -> tuple[Tensor, Tensor]:
    """Look up `estimator` in ADVANTAGE_ESTIMATORS and run it; `options` are the shared keyword arguments."""
    return ADVANTAGE_ESTIMATORS.get(estimator)(rewards, response_mask, group_index, **options)
