"""One update from an Experience: old/reference logprobs and the critic's values, then mini-batches of micro-batches
on the workers for the policy and the critic."""

from __future__ import annotations

import dataclasses

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.algorithms.loss import LOGPROB_GAP
from rl.core.algorithms.value_loss import ValueLossSettings
from rl.trainer.batching import MicroBatching, attach, gather
from rl.trainer.experience import Experience
from rl.trainer.workers.worker_group import WorkerGroup


def loss_settings(cfg, on_policy: bool = False) -> tuple[LossSettings, ValueLossSettings | None]:
    """The policy's loss settings and, with GAE, the critic's. The policy's measure the first mini-batch's gap to
    the engine's logprobs: with trainer.exact_on_policy as `exact_logprob_gap`; where the on-policy shortcut
    (`on_policy`) skips the old-logprob pass, the gap that pass would have measured."""
    algorithm = cfg.trainer.algorithm
    exact = cfg.trainer.exact_on_policy
    policy = dataclasses.replace(LossSettings.from_config(algorithm, cfg.generator), measure_logprob_gap=exact,
                                 measure_rollout_gap=on_policy and not exact)
    critic = ValueLossSettings.from_config(algorithm, cfg.generator) if algorithm.advantage_estimator == "gae" else None
    return policy, critic


def micro_batching(cfg, dp_size: int, pad_token_id: int, train: bool) -> MicroBatching:
    """Micro-batches for `dp_size` data-parallel shards (the group's DP size, not its number of workers)."""
    trainer, gen = cfg.trainer, cfg.generator
    size = trainer.micro_train_batch_size_per_gpu if train else trainer.micro_forward_batch_size_per_gpu
    budget = trainer.max_tokens_per_micro_batch or size * (gen.max_prompt_length + gen.max_generate_length)
    return MicroBatching(packed=trainer.use_sample_packing, max_tokens=budget, micro_batch_size=size,
                         dp_size=dp_size, pad_token_id=pad_token_id)


def compute_logprobs(group: WorkerGroup, batching: MicroBatching, experience: Experience, has_ref: bool,
                     on_policy: bool = False, ref: tuple[WorkerGroup, MicroBatching] | None = None,
                     critic: tuple[WorkerGroup, MicroBatching] | None = None) -> None:
    """Adds old_logprobs (policy before the update), with a reference model ref_logprobs, and with a critic
    old_values (its values before the update) to every sequence; the passes run side by side.

    `on_policy` (one optimizer step per rollout batch): the policy's pass is skipped, since its logprobs are the
    ones the training forward computes before the only update; the loss then takes them detached as the old ones.
    `ref`: the reference model's own group and micro-batching, when it has workers of its own (its pass then runs
    beside the policy's); otherwise the reference lives on the policy's workers. `critic`: the group holding the
    critic (the policy's or its own) and its micro-batching.
    """
    sequences = experience.sequences
    batches = batching.split(sequences)
    passes = [("old_logprobs", group, batches, ("logprobs", "policy"))] if not on_policy else []
    if has_ref:
        ref_group, ref_batches = (ref[0], ref[1].split(sequences)) if ref is not None else (group, batches)
        passes.append(("ref_logprobs", ref_group, ref_batches, ("logprobs", "ref")))
    if critic is not None:
        critic_group, critic_batching = critic
        critic_batches = batches if critic_group is group else critic_batching.split(sequences)
        passes.append(("old_values", critic_group, critic_batches, ("values",)))
    started = [(field, owner, shards, owner.submit_sharded(call[0], shards, *call[1:]))
               for field, owner, shards, call in passes]
    for field, owner, shards, pending in started:
        attach(sequences, field, gather(shards, owner.collect_sharded(pending), len(sequences)))


def is_on_policy(train_batch_size: int, policy_mini_batch_size: int, update_epochs: int = 1) -> bool:
    """Whether each rollout batch gets exactly one optimizer step (a single mini-batch, one pass)."""
    return policy_mini_batch_size >= train_batch_size and update_epochs == 1


def normalizer(settings: LossSettings | ValueLossSettings, sequences: list[dict], dp_size: int) -> LossNormalizer:
    """Mini-batch totals, so each micro-batch's loss is its share of the mini-batch loss (see reduction.py)."""
    tokens = sum(int(seq["loss_mask"].sum()) for seq in sequences)
    with_loss = sum(1 for seq in sequences if bool(seq["loss_mask"].any()))
    return LossNormalizer.from_counts(settings.loss_reduction, tokens, with_loss,
                                      max_generate_length=settings.max_generate_length, dp_world_size=dp_size)


def update_policy(group: WorkerGroup, batching: MicroBatching, settings: LossSettings | ValueLossSettings,
                  experience: Experience, mini_batch_sequences: int, epochs: int = 1, model: str = "policy"
                  ) -> dict[str, float]:
    """One optimizer step of `model` (the policy, or the critic with `ValueLossSettings`) per mini-batch, `epochs`
    passes over the batch; returns the metrics averaged over all steps (each mini-batch's metrics are the sum of
    its shards' shares)."""
    sequences = experience.sequences
    totals: dict[str, float] = {}
    starts = [start for _ in range(epochs) for start in range(0, len(sequences), mini_batch_sequences)]
    for start in starts:
        mini = sequences[start:start + mini_batch_sequences]
        results = group.call_sharded("train_mini_batch", batching.split(mini), settings,
                                     normalizer(settings, mini, group.dp_size), model)
        metrics: dict[str, float] = {}
        for shard, _ in results:  # a shard whose micro-batches were all empty reports only its zero loss
            for name, value in shard.items():
                metrics[name] = metrics.get(name, 0.0) + value
        metrics.update(results[0][1])  # grad norm and LR: the same on every rank
        for name, value in metrics.items():  # skipped optimizer steps are counted, the rest averaged
            if name == LOGPROB_GAP:  # before any update: the first mini-batch's alone
                totals.setdefault(name, value)
                continue
            totals[name] = totals.get(name, 0.0) + (value if name == "skipped_steps" else value / len(starts))
    return totals
