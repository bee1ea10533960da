"""The KL penalty in the reward (`trainer.algorithm.use_kl_in_reward`, `trainer.algorithm.kl_ctrl`, SkyRL's keys).

Each token's reward loses beta * kl, kl the per-token estimate (`trainer.algorithm.kl_estimator_type`, as SkyRL; veRL
names it `algorithm.kl_penalty` and defaults to k1) of KL(policy || reference) at the sampled token. beta starts at
`trainer.algorithm.kl_loss_coef` (SkyRL's coefficient for both uses of the KL) and is kept by a controller:

- `FixedKLController`: beta never moves.
- `AdaptiveKLController` (Ziegler et al. 2019, arXiv 1909.08593; veRL's and SkyRL's): after each batch,
  beta *= 1 + clip(kl / kl_target - 1, -0.2, 0.2) * n_steps / horizon, with kl the batch's mean KL and n_steps the
  number of sequences it held. beta grows while the policy drifts beyond the target and shrinks while it stays
  inside; the clip bounds the relative change per sequence at 0.2 / horizon.

A controller's `state_dict` goes into checkpoints, so a resumed run continues with the beta it had reached.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rl.core.algorithms.kl import KL_ESTIMATORS
from rl.core.registry import Registry

KL_CONTROLLERS: Registry = Registry("KL controller")
"""`trainer.algorithm.kl_ctrl.type` -> a function building the controller from `trainer.algorithm`."""

PROPORTIONAL_ERROR_BOUND = 0.2


class FixedKLController:
    """beta = `kl_coef` throughout."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing moves (the same call as the adaptive controller's, so the loop does not branch)."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """beta moved towards the value that holds the measured KL at `target_kl` over `horizon` sequences."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if not target_kl > 0:
            raise ValueError(f"trainer.algorithm.kl_ctrl.kl_target must be > 0, got {target_kl}")
        if not horizon > 0:
            raise ValueError(f"trainer.algorithm.kl_ctrl.horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """beta *= 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon."""
        error = min(max(current_kl / self.target - 1.0, -PROPORTIONAL_ERROR_BOUND), PROPORTIONAL_ERROR_BOUND)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


@KL_CONTROLLERS.register("fixed")
def _fixed(algorithm_cfg: Any) -> FixedKLController:
    return FixedKLController(algorithm_cfg.kl_loss_coef)


@KL_CONTROLLERS.register("adaptive")
def _adaptive(algorithm_cfg: Any) -> AdaptiveKLController:
    ctrl = algorithm_cfg.kl_ctrl
    return AdaptiveKLController(algorithm_cfg.kl_loss_coef, ctrl.kl_target, ctrl.horizon)


def kl_controller(algorithm_cfg: Any) -> FixedKLController | AdaptiveKLController:
    """The controller `trainer.algorithm.kl_ctrl.type` names, starting at `trainer.algorithm.kl_loss_coef`."""
    name = algorithm_cfg.kl_ctrl.type
    if name not in KL_CONTROLLERS:
        raise ValueError(f"trainer.algorithm.kl_ctrl.type: {KL_CONTROLLERS.unknown_message(name)}")
    return KL_CONTROLLERS.get(name)(algorithm_cfg)


def kl_penalized_token_rewards(
    token_rewards: Tensor, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, beta: float, kl_estimator: str
) -> tuple[Tensor, float]:
    """(token_rewards - max(beta, 0) * kl * mask, mean over sequences of each sequence's mean kl over its masked
    tokens).

    All tensors are [B, T]. The second value is what the adaptive controller's `update` takes (veRL's
    `apply_kl_penalty`, SkyRL's `avg_kl`); a sequence without masked tokens counts with kl 0. beta is floored at 0
    as in SkyRL (an adaptive update over more than 5 * horizon sequences could push it below). `logprobs` are the
    policy's at sampling time (the old logprobs), so nothing here carries a gradient.
    """
    weights = mask.to(logprobs.dtype)
    kl = KL_ESTIMATORS.get(kl_estimator)(logprobs.detach(), ref_logprobs.detach())
    kl = torch.where(mask.bool(), kl, 0.0)  # padding may hold anything: no NaN leaks through a product
    per_sequence = kl.sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
    return token_rewards - max(beta, 0.0) * kl, float(per_sequence.mean()) if per_sequence.numel() else 0.0
