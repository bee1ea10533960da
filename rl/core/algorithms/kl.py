"""Per-token KL estimators between the policy and the reference policy, registered in `KL_ESTIMATORS`.

Every estimator is ``fn(logprob, ref_logprob) -> kl`` (same shape as the inputs), following Schulman's k1/k2/k3
approximations of KL(pi || pi_ref) evaluated on tokens sampled from pi. Gradients flow through `logprob`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rl.core.registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator")

K3_LOG_RATIO_BOUND = 20.0
K3_BOUND = 10.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """log pi - log pi_ref."""
    return logprob - ref_logprob


@KL_ESTIMATORS.register("abs")
def kl_abs(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """|log pi - log pi_ref|."""
    return (logprob - ref_logprob).abs()


@KL_ESTIMATORS.register("k2")
def kl_k2(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """0.5 * (log pi - log pi_ref)^2."""
    return 0.5 * (logprob - ref_logprob).square()


@KL_ESTIMATORS.register("k3")
def kl_k3(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """exp(ref - logp) - (ref - logp) - 1 (veRL's low_var_kl): log ratio clamped to +-20, result to [-10, 10]."""
    log_ratio = (ref_logprob - logprob).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    return (torch.exp(log_ratio) - log_ratio - 1).clamp(-K3_BOUND, K3_BOUND)


def compute_kl(estimator: str, logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """Look up `estimator` in KL_ESTIMATORS and apply it."""
    return KL_ESTIMATORS.get(estimator)(logprob, ref_logprob)
