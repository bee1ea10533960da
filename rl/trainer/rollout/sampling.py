"""One step's scored rollouts under `trainer.algorithm.dynamic_sampling` (DAPO's `filter`, POLARIS's `replace`).

A scored batch is the prompt records, their rollouts (prompt-major, `n` per prompt, `prompt_index` into the
records) and one reward per rollout. `filter` keeps the groups whose rewards differ and draws further batches until
`train_batch_size` such groups are collected (then cut to exactly that many); `replace` fills the places of the
groups without signal with copies of groups that have it, when those are more than `min_replace_ratio` of the
batch, else it draws a new batch. Either way at most `max_sample_batches` batches are generated for one step.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rl.core.algorithms.reward_shaping import groups_with_signal


class SamplingExhausted(RuntimeError):
    """Dynamic sampling generated its bound of batches without collecting enough groups with signal."""


@dataclass
class ScoredBatch:
    records: list
    rollouts: list
    rewards: Tensor  # [B]

    def groups(self, n: int) -> list[tuple[object, list, Tensor]]:
        """(record, its n rollouts, their rewards) per prompt."""
        return [(self.records[g], self.rollouts[g * n:(g + 1) * n], self.rewards[g * n:(g + 1) * n])
                for g in range(len(self.records))]

    @staticmethod
    def of_groups(groups: list[tuple[object, list, Tensor]]) -> ScoredBatch:
        """A batch of these groups, the rollouts' prompt_index renumbered to their new places."""
        records, rollouts, rewards = [], [], []
        for g, (record, members, scores) in enumerate(groups):
            records.append(record)
            rollouts.extend(dataclasses.replace(r, prompt_index=g) for r in members)
            rewards.append(scores)
        return ScoredBatch(records, rollouts, torch.cat(rewards) if rewards else torch.zeros(0))


def collect_step_batch(draw: Callable[[], ScoredBatch], settings, batch_size: int, n: int, seed: int
                       ) -> tuple[ScoredBatch, list[ScoredBatch], dict[str, float]]:
    """(the batch to train on, every batch generated, metrics). `settings` is the dynamic_sampling block;
    `draw()` generates and scores the next prompt batch."""
    first = draw()
    if settings.type is None:
        return first, [first], {}
    bound = settings.max_sample_batches
    generated, kept, dropped, replaced = [first], [], 0, 0
    batch = first
    while True:
        signal = groups_with_signal(batch.rewards, n).tolist()
        groups = batch.groups(n)
        good = [group for group, ok in zip(groups, signal, strict=True) if ok]
        dropped += len(groups) - len(good)
        if settings.type == "filter":
            kept.extend(good)
            if len(kept) >= batch_size:
                result = ScoredBatch.of_groups(kept[:batch_size])
                break
        elif len(good) > settings.min_replace_ratio * len(groups):
            rng = random.Random(seed + len(generated))
            bad = len(groups) - len(good)
            copies = [good[i] for i in _replacement_indices(len(good), bad, rng)]
            replaced, copies_iter = bad, iter(copies)
            result = ScoredBatch.of_groups([group if ok else next(copies_iter)
                                            for group, ok in zip(groups, signal, strict=True)])
            break
        if bound != -1 and len(generated) >= bound:
            have = f"{len(kept)} of {batch_size} groups" if settings.type == "filter" else \
                f"{len(good)} of {len(groups)} groups (more than {settings.min_replace_ratio:g} needed)"
            raise SamplingExhausted(
                f"trainer.algorithm.dynamic_sampling: {len(generated)} batches generated (max_sample_batches) and "
                f"only {have} had rewards that differ within the group; raise max_sample_batches, sample more per "
                "prompt, or use data the policy neither always solves nor always fails")
        batch = draw()
        generated.append(batch)
    metrics = {"dynamic_sampling_batches": float(len(generated)), "dynamic_sampling_dropped_groups": float(dropped),
               "dynamic_sampling_replaced_groups": float(replaced)}
    return result, generated, metrics


def _replacement_indices(candidates: int, needed: int, rng: random.Random) -> list[int]:
    """Which good groups fill `needed` places: distinct ones while there are enough, then drawn with repeats."""
    if candidates >= needed:
        return rng.sample(range(candidates), needed)
    return [rng.randrange(candidates) for _ in range(needed)]
