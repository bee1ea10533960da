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
class SapoConfig:
    """SAPO's soft gate f(r) = sigmoid(tau * (r - 1)) * 4 / tau in place of the PPO clip (policy_loss_type `sapo`,
    SkyRL's keys; arXiv 2511.20347). A larger tau fades the gradient faster as r leaves 1."""

    tau_pos: float
    """tau of tokens with a positive advantage, > 0."""

    tau_neg: float
    """tau of tokens with a zero or negative advantage, > 0 (the paper's 1.05 for Qwen3-30B-A3B)."""


@dataclass(kw_only=True)
class ClipCovConfig:
    """Clip-Cov (policy_loss_type `clip_cov`, SkyRL's keys; arXiv 2505.22617): the PPO clip loss, with the gradient
    cut on a few tokens drawn among those whose covariance (A - mean A) * (logp - mean logp) over the micro-batch
    lies between the bounds."""

    clip_ratio: float
    """Share of the micro-batch's loss tokens whose gradient is cut (at least one), in (0, 1]."""

    clip_cov_lb: float
    """Covariance above which a token may be drawn; below clip_cov_ub."""

    clip_cov_ub: float
    """Covariance below which a token may be drawn."""


@dataclass(kw_only=True)
class KLCovConfig:
    """KL-Cov (policy_loss_type `kl_cov`, SkyRL's keys; arXiv 2505.22617): the unclipped policy gradient, plus a
    |logp - old| penalty on the tokens of largest covariance (A - mean A) * (logp - mean logp) in the micro-batch."""

    kl_cov_frac: float
    """Share of the micro-batch's loss tokens that get the penalty (at least one), in (0, 1]."""

    ppo_kl_coef: float
    """Weight of the |logp - old| penalty, >= 0."""


@dataclass(kw_only=True)
class KLCtrlConfig:
    """How the coefficient of the KL penalty in the reward moves (`use_kl_in_reward`; SkyRL's and veRL's keys). It
    starts at kl_loss_coef; see rl/core/algorithms/kl_controller.py."""

    type: str
    """`fixed` (the coefficient stays kl_loss_coef) or `adaptive` (after each batch it is multiplied by
    1 + clip(kl / kl_target - 1, -0.2, 0.2) * sequences / horizon, kl the batch's mean KL per sequence)."""

    kl_target: float
    """`adaptive`: the mean KL per sequence the coefficient steers towards, > 0."""

    horizon: int
    """`adaptive`: the coefficient moves by at most a factor of about e^0.2 per `horizon` sequences (the error is
    clipped to +-0.2), >= 1."""


@dataclass(kw_only=True)
class AlgorithmConfig:
    """Advantage estimation and the loss."""

    advantage_estimator: str
    """One of `grpo`, `rloo`, `reinforce++`, `gae` (PPO with a critic: `trainer.critic`), `no_op` (the token rewards
    as they are, e.g. the teacher's reverse KL of on-policy distillation with use_kl_in_reward). `grpo` and `rloo`
    compare samples of the same prompt, so they need generator.n_samples_per_prompt >= 2."""

    grpo_norm_by_std: bool
    """GRPO: divide each group's centred rewards by the group's standard deviation."""

    zero_variance_filter: bool
    """Take the samples of a prompt whose rewards are all equal (within zero_variance_filter_tol) out of the loss
    and its token count (SkyRL's key): they carry no group-relative signal, and would otherwise still weigh in the
    KL term and the normaliser. Logged as zero_variance_groups, the share of prompts masked."""

    zero_variance_filter_tol: float
    """Rewards of one prompt within this distance (max - min) count as equal, >= 0 (SkyRL's key)."""

    policy_loss_type: str
    """One of `regular` (PPO clip), `dual_clip`, `gspo`, `cispo`, `sapo` (soft gate, `sapo` block), `clip_cov` and
    `kl_cov` (covariance-selected tokens, `clip_cov` / `kl_cov` blocks), `importance_sampling` (-r * A, no clip; with
    advantage_estimator `no_op` for on-policy distillation). Formulas: rl/core/algorithms/policy_loss.py."""

    loss_reduction: str
    """One of `token_mean`, `sequence_mean`, `seq_mean_token_sum_norm`; normalized over the whole mini-batch."""

    eps_clip_low: float
    """Lower clip range of the importance ratio: ratios below 1 - eps_clip_low are clipped. >= 0."""

    eps_clip_high: float
    """Upper clip range of the importance ratio: ratios above 1 + eps_clip_high are clipped. >= 0."""

    clip_ratio_c: float
    """Dual-clip bound for negative advantages (policy_loss_type `dual_clip`); must be > 1."""

    use_kl_loss: bool
    """Add a KL penalty against the reference model to the loss. Not with use_kl_in_reward."""

    use_kl_in_reward: bool
    """Subtract kl_coef * KL(policy || reference) from every response token's reward before the advantages, the
    coefficient starting at kl_loss_coef and kept by `kl_ctrl` (SkyRL's and veRL's key). Not with use_kl_loss."""

    kl_ctrl: KLCtrlConfig
    """The coefficient of the KL penalty in the reward (use_kl_in_reward)."""

    kl_loss_coef: float
    """Weight of the KL penalty, >= 0: in the loss (use_kl_loss), or the starting coefficient in the reward
    (use_kl_in_reward), as in SkyRL."""

    kl_estimator_type: str
    """KL estimator of both penalties: one of `k1`, `k2`, `k3`, `abs`."""

    use_entropy_loss: bool
    """Add an entropy bonus to the loss."""

    entropy_loss_coef: float
    """Weight of the entropy bonus, >= 0."""

    gamma: float
    """Discount factor in [0, 1] (`gae`, `reinforce++`)."""

    lambd: float
    """GAE lambda in [0, 1]."""

    value_clip: float | None
    """`gae`: the critic's values move at most this far from their values before the update in the clipped term
    of the value loss (PPO's value clipping, SkyRL's and veRL's key); null trains on the plain squared error."""

    sapo: SapoConfig
    """policy_loss_type `sapo`: the gate's temperatures."""

    clip_cov: ClipCovConfig
    """policy_loss_type `clip_cov`: which tokens lose their gradient."""

    kl_cov: KLCovConfig
    """policy_loss_type `kl_cov`: which tokens get the KL penalty, and its weight."""

    off_policy_correction: OffPolicyCorrectionConfig
    """Trainer-vs-rollout mismatch corrections (the mismatch itself is logged every step)."""

    dynamic_sampling: DynamicSamplingConfig
    """Groups without reward variance: dropped and refilled, or replaced."""

    overlong_buffer: OverlongBufferConfig
    """Soft penalty on responses that approach the generation budget."""
