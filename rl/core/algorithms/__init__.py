"""RL algorithms as small pure functions over tensors, each registered by name.

- `ADVANTAGE_ESTIMATORS` (advantages.py): grpo, rloo, reinforce++, gae, no_op.
- `KL_ESTIMATORS` (kl.py): k1, abs, k2, k3; `KL_CONTROLLERS` (kl_controller.py): fixed, adaptive, for the KL
  penalty in the reward.
- `POLICY_LOSSES` (policy_loss.py): regular, dual_clip, gspo, cispo, sapo, clip_cov, kl_cov, importance_sampling.
- `LOSS_REDUCTIONS` (reduction.py): token_mean, sequence_mean, seq_mean_token_sum_norm, normalized over the whole
  mini-batch so gradients do not depend on the micro-batch or data-parallel split.
- `compute_policy_loss` + `LossSettings` (loss.py): the one loss assembly every backend uses.
"""

from rl.core.algorithms.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, masked_whiten
from rl.core.algorithms.kl import KL_ESTIMATORS, compute_kl
from rl.core.algorithms.loss import LossSettings, compute_policy_loss
from rl.core.algorithms.policy_loss import POLICY_LOSSES
from rl.core.algorithms.reduction import (
    LOSS_REDUCTIONS,
    LossNormalizer,
    LossReduction,
    loss_counts,
    masked_sum,
    mini_batch_normalizer,
)
from rl.core.algorithms.segments import segment_masked_mean, segment_sum

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_REDUCTIONS",
    "POLICY_LOSSES",
    "LossNormalizer",
    "LossReduction",
    "LossSettings",
    "compute_advantages",
    "compute_kl",
    "compute_policy_loss",
    "loss_counts",
    "masked_sum",
    "masked_whiten",
    "mini_batch_normalizer",
    "segment_masked_mean",
    "segment_sum",
]
