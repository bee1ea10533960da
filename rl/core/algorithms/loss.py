"""The one policy-loss assembly shared by every backend: policy loss + KL loss - entropy bonus, reduced once.

A backend supplies per-token logprobs (and entropy when wanted) for a micro-batch, calls `compute_policy_loss`
with the mini-batch's `LossNormalizer`, and runs ``loss.backward()``; see `reduction.py` for why micro-batch
losses are summed (never averaged) and how `dp_world_size` handles DP gradient averaging.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from rl.core.algorithms.kl import KL_ESTIMATORS
from rl.core.algorithms.policy_loss import POLICY_LOSSES
from rl.core.algorithms.reduction import LOSS_REDUCTIONS, LossNormalizer, masked_sum, mini_batch_normalizer
from rl.core.registry import Registry

_GENERATOR_FIELDS = ("max_generate_length",)
_NESTED_FIELDS = {
    "tau_pos": ("sapo", "tau_pos"),
    "tau_neg": ("sapo", "tau_neg"),
    "clip_cov_ratio": ("clip_cov", "clip_ratio"),
    "clip_cov_lb": ("clip_cov", "clip_cov_lb"),
    "clip_cov_ub": ("clip_cov", "clip_cov_ub"),
    "kl_cov_frac": ("kl_cov", "kl_cov_frac"),
    "ppo_kl_coef": ("kl_cov", "ppo_kl_coef"),
}
"""Fields read from a block of trainer.algorithm (`trainer.algorithm.sapo.tau_pos`); they are the loss options."""


def _read(cfg: Any, name: str, default: Any) -> Any:
    if cfg is None:
        return default
    if isinstance(cfg, Mapping):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def _key(field: str) -> str:
    return "trainer.algorithm." + ".".join(_NESTED_FIELDS.get(field, (field,)))


def _check_choice(registry: Registry, key: str, name: str) -> None:
    if name not in registry:
        raise ValueError(f"{key}: {registry.unknown_message(name)}")


LOGPROB_GAP = "exact_logprob_gap"
"""The token mean of |training forward - old logprob| over a mini-batch's loss tokens: with
trainer.exact_on_policy, where the old logprobs are the engine's, 0.0 on the first mini-batch exactly when the
trainer's arithmetic matched the engine's."""

ROLLOUT_GAP = "rollout_logprob_abs_diff_mean"
"""The token mean of |trainer logprob - engine logprob| over the loss tokens: measured by the old-logprob pass
(`off_policy.mismatch_metrics`), or, where the on-policy shortcut skips that pass, by the update's own forward
(`LossSettings.measure_rollout_gap`), which holds the same weights."""


@dataclass(frozen=True)
class LossSettings:
    """Loss options; field names mirror the `trainer.algorithm.*` config keys (and `generator.max_generate_length`);
    those of `_NESTED_FIELDS` come from a block (`sapo.tau_pos`, `clip_cov.clip_ratio`, `kl_cov.kl_cov_frac`)."""

    policy_loss_type: str = "regular"
    loss_reduction: str = "token_mean"
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    clip_ratio_c: float = 3.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_estimator_type: str = "k3"
    use_entropy_loss: bool = False
    entropy_loss_coef: float = 0.01
    max_generate_length: int | None = None
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_frac: float = 0.2
    ppo_kl_coef: float = 1.0
    measure_logprob_gap: bool = False  # trainer.exact_on_policy: report LOGPROB_GAP
    measure_rollout_gap: bool = False  # the on-policy shortcut (no old-logprob pass): report ROLLOUT_GAP

    def __post_init__(self) -> None:
        _check_choice(POLICY_LOSSES, "trainer.algorithm.policy_loss_type", self.policy_loss_type)
        _check_choice(LOSS_REDUCTIONS, "trainer.algorithm.loss_reduction", self.loss_reduction)
        _check_choice(KL_ESTIMATORS, "trainer.algorithm.kl_estimator_type", self.kl_estimator_type)
        if not 0.0 <= self.eps_clip_low < 1.0:
            raise ValueError(f"trainer.algorithm.eps_clip_low must be in [0, 1), got {self.eps_clip_low}")
        if self.eps_clip_high < 0.0:
            raise ValueError(f"trainer.algorithm.eps_clip_high must be >= 0, got {self.eps_clip_high}")
        if self.policy_loss_type == "dual_clip" and not self.clip_ratio_c > 1.0:
            raise ValueError(f"trainer.algorithm.clip_ratio_c must be > 1 for dual_clip, got {self.clip_ratio_c}")
        self._check_loss_options()
        # raises, naming generator.max_generate_length, when the reduction needs it and it is missing
        LOSS_REDUCTIONS.get(self.loss_reduction).denominator(1, 1, self.max_generate_length)

    def _check_loss_options(self) -> None:
        for name in ("tau_pos", "tau_neg"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{_key(name)} must be > 0, got {getattr(self, name)}")
        for name in ("clip_cov_ratio", "kl_cov_frac"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{_key(name)} must be in (0, 1], got {getattr(self, name)}")
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(
                f"{_key('clip_cov_lb')} ({self.clip_cov_lb}) must be below {_key('clip_cov_ub')} ({self.clip_cov_ub})"
            )
        if self.ppo_kl_coef < 0.0:
            raise ValueError(f"{_key('ppo_kl_coef')} must be >= 0, got {self.ppo_kl_coef}")

    def loss_options(self) -> dict[str, float]:
        """The settings only some policy losses read, as the keyword arguments of `POLICY_LOSSES` functions."""
        return {name: getattr(self, name) for name in _NESTED_FIELDS}

    @classmethod
    def from_config(cls, algorithm_cfg: Any, generator_cfg: Any = None) -> LossSettings:
        """Read the fields by name from the algorithm config (and max_generate_length from the generator config);
        attributes (or mapping keys) the configs lack keep the defaults above."""
        values = {}
        for field in dataclasses.fields(cls):
            if field.name in _NESTED_FIELDS:
                block, name = _NESTED_FIELDS[field.name]
                values[field.name] = _read(_read(algorithm_cfg, block, None), name, field.default)
                continue
            source = generator_cfg if field.name in _GENERATOR_FIELDS else algorithm_cfg
            values[field.name] = _read(source, field.name, field.default)
        return cls(**values)

    def normalizer(
        self,
        loss_mask: Tensor,
        *,
        seq_ids: Tensor | None = None,
        num_sequences: int | None = None,
        dp_world_size: int = 1,
    ) -> LossNormalizer:
        """`mini_batch_normalizer` for this reduction, from the loss mask of the whole mini-batch."""
        return mini_batch_normalizer(
            self.loss_reduction,
            loss_mask,
            seq_ids=seq_ids,
            num_sequences=num_sequences,
            max_generate_length=self.max_generate_length,
            dp_world_size=dp_world_size,
        )


def _check_inputs(settings: LossSettings, normalizer: LossNormalizer, logprobs: Tensor, **tensors) -> None:
    if normalizer.reduction != settings.loss_reduction:
        raise ValueError(
            f"normalizer was built for '{normalizer.reduction}' but trainer.algorithm.loss_reduction is "
            f"'{settings.loss_reduction}'"
        )
    for name, tensor in tensors.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but logprobs has {tuple(logprobs.shape)}")
    if settings.use_kl_loss and tensors["ref_logprobs"] is None:
        raise ValueError("trainer.algorithm.use_kl_loss is on but no ref_logprobs were given")
    if settings.use_entropy_loss and tensors["entropy"] is None:
        raise ValueError("trainer.algorithm.use_entropy_loss is on but no entropy was given")


def _policy_term(settings: LossSettings, logprobs, old_logprobs, advantages, loss_mask, seq_ids, num_sequences):
    return POLICY_LOSSES.get(settings.policy_loss_type)(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        eps_clip_low=settings.eps_clip_low,
        eps_clip_high=settings.eps_clip_high,
        clip_ratio_c=settings.clip_ratio_c,
        seq_ids=seq_ids,
        num_sequences=num_sequences,
        **settings.loss_options(),
    )


def compute_policy_loss(
    settings: LossSettings,
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    loss_mask: Tensor,
    normalizer: LossNormalizer,
    *,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    seq_ids: Tensor | None = None,
    num_sequences: int | None = None,
    rollout_logprobs: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Micro-batch loss ``reduce(pg + kl_loss_coef * kl - entropy_loss_coef * entropy) * dp_world_size``.

    Token tensors are padded ``[B, T]`` or flat packed ``[N]`` (then pass `seq_ids`, and `num_sequences` to avoid
    a host sync, e.g. ``PackedBatch.token_seq_ids()`` / ``num_sequences``). `normalizer` belongs to the whole
    mini-batch (`LossSettings.normalizer`). Metrics are detached scalars that are this micro-batch's share of the
    mini-batch value: sum them over micro-batches and (all-reduce SUM) over DP ranks. ``pg_loss``, ``kl_loss``,
    ``kl`` (with ref_logprobs) and ``entropy`` (with entropy) use the loss reduction; ``pg_clipfrac``,
    ``pg_clipfrac_lower`` and ``ppo_kl`` are token means.

    ``old_logprobs=None`` means on-policy: the weights being trained are the ones that were just evaluated for
    this batch (one optimizer step per rollout batch), so the old logprobs are ``logprobs.detach()`` and the ratio
    is exactly 1, which saves the separate old-logprob forward pass. The engine's `rollout_logprobs` then give the
    trainer-vs-engine gap (ROLLOUT_GAP, with `settings.measure_rollout_gap`) that pass would have measured.
    """
    if old_logprobs is None:
        old_logprobs = logprobs.detach()
    _check_inputs(
        settings,
        normalizer,
        logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        loss_mask=loss_mask,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
        seq_ids=seq_ids,
    )
    if seq_ids is None and num_sequences is None and logprobs.dim() == 2:
        num_sequences = logprobs.shape[0]
    reduction = LOSS_REDUCTIONS.get(settings.loss_reduction)

    def reduce(per_token: Tensor) -> Tensor:
        return reduction(per_token, loss_mask, normalizer.denominator, seq_ids, num_sequences)

    total, token_metrics = _policy_term(settings, logprobs, old_logprobs, advantages, loss_mask, seq_ids, num_sequences)
    metrics = {"pg_loss": reduce(total.detach())}
    if ref_logprobs is not None:
        kl = KL_ESTIMATORS.get(settings.kl_estimator_type)(logprobs, ref_logprobs)
        metrics["kl"] = reduce(kl.detach())
        if settings.use_kl_loss:
            total = total + settings.kl_loss_coef * kl
            metrics["kl_loss"] = metrics["kl"]
    if entropy is not None:
        metrics["entropy"] = reduce(entropy.detach())
        if settings.use_entropy_loss:
            total = total - settings.entropy_loss_coef * entropy
    for name, per_token in token_metrics.items():
        metrics[name] = masked_sum(per_token, loss_mask) / normalizer.num_tokens
    # the training forward against the engine's logprobs: the old ones (exact on-policy), or the rollout's
    for name, measured, engine in ((LOGPROB_GAP, settings.measure_logprob_gap, old_logprobs),
                                   (ROLLOUT_GAP, settings.measure_rollout_gap, rollout_logprobs)):
        if measured and engine is not None:
            metrics[name] = masked_sum((logprobs.detach() - engine).abs(), loss_mask) / normalizer.num_tokens
    return reduce(total) * normalizer.dp_world_size, metrics
