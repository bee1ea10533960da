"""The `trainer.algorithm` block of the config tree: advantages and the loss, the off-policy corrections, and
DAPO's dynamic sampling and overlong penalty. Each field's docstring is its reference documentation; values come
from `defaults.yaml` like the rest of `rl.core.config.schema`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class OffPolicyCorrectionConfig:
    """Corrections for the gap between the rollout engine's logprobs and the trainer's (SkyRL's keys; all off by
    default). r = pi_old / pi_rollout per loss token; rejected tokens leave the loss, and TIS weights scale the
    policy-gradient term (not KL or entropy). Any correction on makes the trainer compute old logprobs in a pass
    of their own, also with one optimizer step per batch. See rl/core/algorithms/off_policy.py."""

    tis_ratio_type: str | None
    """Truncated importance sampling: `token` (weight min(r, token_tis_ratio_clip_high)), `sequence` (weight
    min(prod r, sequence_tis_ratio_clip_high) for the whole sequence) or null (off)."""

    token_tis_ratio_clip_high: float
    """Cap of the token-level TIS weight, > 0."""

    sequence_tis_ratio_clip_high: float
    """Cap of the sequence-level TIS weight, > 0."""

    sequence_mask_metric: str | None
    """Reject whole sequences: `geometric` (geometric-mean r outside [geo_mask_low, geo_mask_high]), `product`
    (prod r outside [product_mask_low, product_mask_high]) or null (off)."""

    geo_mask_high: float
    """Upper bound of the geometric-mean ratio (`geometric`)."""

    geo_mask_low: float
    """Lower bound of the geometric-mean ratio (`geometric`)."""

    product_mask_high: float
    """Upper bound of the product of ratios (`product`)."""

    product_mask_low: float
    """Lower bound of the product of ratios (`product`)."""

    outlier_token_is_threshold_low: float | None
    """Reject sequences with any token's r below this; null turns it off."""

    outlier_token_is_threshold_high: float | None
    """Reject sequences with any token's r above this; null turns it off."""

    token_mask_is_threshold_low: float | None
    """With token_mask_is_threshold_high: reject single tokens whose r is below this."""

    token_mask_is_threshold_high: float | None
    """With token_mask_is_threshold_low: reject single tokens whose r is above this."""


@dataclass(kw_only=True)
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (SkyRL's keys): groups whose samples all got the same reward carry no GRPO signal."""

    type: str | None
    """`filter` drops such groups and generates further prompt batches until train_batch_size groups with signal
    are collected; `replace` (POLARIS) fills their places with copies of groups that have signal, when those are
    more than min_replace_ratio of the batch (else it samples another batch); null turns it off."""

    max_sample_batches: int
    """Most prompt batches generated for one training step; reaching it ends the run, naming what was collected
    (raise it, or use easier data). -1: no bound."""

    min_replace_ratio: float
    """`replace`: the smallest share of the batch's groups that must have signal, in (0, 1]."""


@dataclass(kw_only=True)
class OverlongBufferConfig:
    """DAPO's soft overlong punishment: a response longer than generator.max_generate_length - len loses up to
    penalty_factor of reward, linearly in how far into the last `len` tokens it reaches."""

    len: int
    """Length of the penalised band at the end of the generation budget, in tokens; 0 turns it off."""

    penalty_factor: float
    """Reward taken from a response that uses the whole budget, >= 0."""


@dataclass(kw_only=True)
class AlgorithmConfig:
    """Advantage estimation and the loss."""

    advantage_estimator: str
    """One of `grpo`, `rloo`, `reinforce++` (and `gae`, refused until a backend trains a critic). `grpo` and `rloo`
    compare samples of the same prompt, so they need generator.n_samples_per_prompt >= 2."""

    grpo_norm_by_std: bool
    """GRPO: divide each group's centred rewards by the group's standard deviation."""

    policy_loss_type: str
    """One of `regular` (PPO clip), `dual_clip`, `gspo`, `cispo`."""

    loss_reduction: str
    """One of `token_mean`, `sequence_mean`, `seq_mean_token_sum_norm`; normalized over the whole mini-batch."""

    eps_clip_low: float
    """Lower clip range of the importance ratio: ratios below 1 - eps_clip_low are clipped. >= 0."""

    eps_clip_high: float
    """Upper clip range of the importance ratio: ratios above 1 + eps_clip_high are clipped. >= 0."""

    clip_ratio_c: float
    """Dual-clip bound for negative advantages (policy_loss_type `dual_clip`); must be > 1."""

    use_kl_loss: bool
    """Add a KL penalty against the reference model to the loss."""

    kl_loss_coef: float
    """Weight of the KL penalty, >= 0."""

    kl_estimator_type: str
    """KL estimator: one of `k1`, `k2`, `k3`, `abs`."""

    use_entropy_loss: bool
    """Add an entropy bonus to the loss."""

    entropy_loss_coef: float
    """Weight of the entropy bonus, >= 0."""

    gamma: float
    """Discount factor in [0, 1] (`gae`, `reinforce++`)."""

    lambd: float
    """GAE lambda in [0, 1]."""

    off_policy_correction: OffPolicyCorrectionConfig
    """Trainer-vs-rollout mismatch corrections (the mismatch itself is logged every step)."""

    dynamic_sampling: DynamicSamplingConfig
    """Groups without reward variance: dropped and refilled, or replaced."""

    overlong_buffer: OverlongBufferConfig
    """Soft penalty on responses that approach the generation budget."""
