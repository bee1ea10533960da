"""How `update_policy` turns the workers' mini-batch metrics into a step's row, on a scripted worker group (the
arithmetic only; the workers' own numbers are the launcher tests'): each mini-batch's metric is the sum of its
shards' shares, the step's the mean over mini-batches, and `exact_logprob_gap` is the first mini-batch's alone
(later mini-batches follow updates, where a gap is expected); and which gap each mode's loss settings measure."""

import pytest
import torch

import rl.backends.registry  # noqa: F401  (the strategies the config names)
from rl.core.algorithms import LossSettings
from rl.core.config import load_config
from rl.trainer.batching import MicroBatching
from rl.trainer.experience import Experience
from rl.trainer.policy_update import loss_settings, update_policy


class _ScriptedGroup:
    """Two data-parallel shards; mini-batch m's shard d reports `shares[m][d]`."""

    dp_size = 2

    def __init__(self, shares: list[list[dict[str, float]]]):
        self.shares, self.calls = shares, 0

    def call_sharded(self, method, shards, *args):
        assert method == "train_mini_batch" and len(shards) == self.dp_size
        results = [(share, {"grad_norm": 1.0 + self.calls}) for share in self.shares[self.calls]]
        self.calls += 1
        return results


def test_mini_batches_are_averaged_and_the_gap_is_the_first_ones():
    sequences = [{"input_ids": torch.tensor([1, 2, 3]), "loss_mask": torch.tensor([0.0, 1.0, 1.0])}
                 for _ in range(4)]
    shares = [[{"pg_loss": 0.5, "exact_logprob_gap": 0.0},
               {"pg_loss": 0.25, "exact_logprob_gap": 0.0}],
              [{"pg_loss": 1.0, "exact_logprob_gap": 0.125},
               {"pg_loss": 0.75, "exact_logprob_gap": 0.5}]]
    group = _ScriptedGroup(shares)
    batching = MicroBatching(packed=True, max_tokens=64, micro_batch_size=1, dp_size=2)
    experience = Experience(sequences, torch.zeros(4), torch.full((4,), 2))
    row = update_policy(group, batching, LossSettings(measure_logprob_gap=True), experience, 2)
    assert group.calls == 2
    assert row["pg_loss"] == pytest.approx(((0.5 + 0.25) + (1.0 + 0.75)) / 2, rel=1e-15)
    assert row["exact_logprob_gap"] == 0.0, "the first mini-batch's, before any update"
    assert row["grad_norm"] == pytest.approx((1.0 + 2.0) / 2, rel=1e-15)


def test_the_gap_each_mode_measures():
    """exact on-policy measures `exact_logprob_gap`; the on-policy shortcut (no old-logprob pass) the rollout gap
    that pass would have measured; a run with the pass measures neither in the update."""
    exact, _ = loss_settings(load_config(["trainer.exact_on_policy=true"]), on_policy=True)
    shortcut, _ = loss_settings(load_config([]), on_policy=True)
    with_pass, _ = loss_settings(load_config([]), on_policy=False)
    assert (exact.measure_logprob_gap, exact.measure_rollout_gap) == (True, False)
    assert (shortcut.measure_logprob_gap, shortcut.measure_rollout_gap) == (False, True)
    assert (with_pass.measure_logprob_gap, with_pass.measure_rollout_gap) == (False, False)
