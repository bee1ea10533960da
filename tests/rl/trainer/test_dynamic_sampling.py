"""Dynamic sampling (DAPO's `filter`, POLARIS's `replace`) on hand-made scored batches, and through the launcher,
synchronous and asynchronous (`trainer.fully_async`: the extra batches come from the queue): a step never trains on
a group whose rewards are all equal, counts what it dropped, and a run whose groups never differ ends naming the
bound."""

from types import SimpleNamespace

import pytest
import torch

from rl.core.algorithms.reward_shaping import groups_with_signal
from rl.core.generation.engine import Rollout
from rl.trainer.rollout.sampling import SamplingExhausted, ScoredBatch, collect_step_batch
from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

N = 2


def _batch(tag: str, group_rewards: list[tuple[float, float]]) -> ScoredBatch:
    """A scored batch whose prompt g is `f"{tag}{g}"` with N rollouts carrying the given rewards."""
    records = [f"{tag}{g}" for g in range(len(group_rewards))]
    rollouts = [Rollout(prompt_index=g, sample_index=s, prompt_ids=[g], response_ids=[s], rollout_logprobs=[0.0],
                        raw_logprobs=None, finish_reason="stop", response_text=f"{tag}{g}/{s}")
                for g in range(len(group_rewards)) for s in range(N)]
    return ScoredBatch(records, rollouts, torch.tensor([r for pair in group_rewards for r in pair]))


def _settings(kind, bound=30, ratio=0.3):
    return SimpleNamespace(type=kind, max_sample_batches=bound, min_replace_ratio=ratio)


def _check_consistent(batch: ScoredBatch):
    for rollout in batch.rollouts:  # each rollout still belongs to its record, at its new place
        assert rollout.response_text.startswith(batch.records[rollout.prompt_index] + "/")


def test_filter_keeps_only_groups_with_signal_across_batches_and_counts_the_dropped():
    batches = iter([_batch("a", [(1, 1), (0, 1), (0, 0), (1, 0)]), _batch("b", [(0, 0), (1, 1), (1, 1), (1, 1)]),
                    _batch("c", [(1, 1), (0, 1), (1, 0), (0, 1)])])
    batch, generated, metrics = collect_step_batch(lambda: next(batches), _settings("filter"), 4, N, seed=0)
    assert batch.records == ["a1", "a3", "c1", "c2"]  # in order, cut to train_batch_size
    assert groups_with_signal(batch.rewards, N).all()
    assert [r.prompt_index for r in batch.rollouts] == [0, 0, 1, 1, 2, 2, 3, 3]
    _check_consistent(batch)
    assert len(generated) == 3
    assert metrics == {"dynamic_sampling_batches": 3.0, "dynamic_sampling_dropped_groups": 2 + 4 + 1,
                       "dynamic_sampling_replaced_groups": 0.0}


def test_replace_fills_groups_without_signal_with_copies_of_groups_with_it():
    batches = iter([_batch("a", [(1, 1), (0, 0), (0, 0), (1, 0)]),  # 1 of 4 has signal: <= 0.3, sample again
                    _batch("b", [(0, 1), (0, 0), (1, 0), (1, 1)])])
    batch, generated, metrics = collect_step_batch(lambda: next(batches), _settings("replace"), 4, N, seed=3)
    assert len(generated) == 2 and len(batch.records) == 4
    assert batch.records[0] == "b0" and batch.records[2] == "b2"  # groups with signal keep their places
    assert {batch.records[1], batch.records[3]} <= {"b0", "b2"}
    assert groups_with_signal(batch.rewards, N).all()
    _check_consistent(batch)
    assert metrics["dynamic_sampling_replaced_groups"] == 2 and metrics["dynamic_sampling_dropped_groups"] == 3 + 2


@pytest.mark.parametrize("kind", ["filter", "replace"])
def test_the_bound_ends_sampling_with_a_message(kind):
    same = lambda: _batch("x", [(1, 1), (0, 0), (1, 1), (0, 1)])  # noqa: E731  (one group of 4 with signal)
    with pytest.raises(SamplingExhausted, match=r"3 batches generated \(max_sample_batches\)"):
        collect_step_batch(same, _settings(kind, bound=3, ratio=0.5), 4, N, seed=0)


def test_off_returns_the_first_batch_untouched():
    first = _batch("a", [(1, 1), (0, 0)])
    batch, generated, metrics = collect_step_batch(lambda: first, _settings(None), 2, N, seed=0)
    assert batch is first and generated == [first] and metrics == {}


# Even rows score 1 on every sample (no signal: always dropped); odd rows alternate 0, 1 over the calls, so any
# n >= 2 consecutive calls (one group, rollouts being prompt-major) differ. The rewards run in the driver in order
# (reward_num_workers=0), which the counter needs. `even` is logged as reward/split/even: the share of even rows.
SPLIT_REWARD = """calls = 0


def split(response, answer, index):
    global calls
    calls += 1
    even = index % 2 == 0
    return {"score": 1.0 if even else float(calls % 2), "even": float(even)}
"""


# asynchronous: a step that drops groups takes the next batches from the queue (generated ahead, within the bound)
ASYNC = ("trainer.placement.colocate_all=false", "trainer.fully_async.enabled=true",
         "trainer.fully_async.max_staleness_steps=1")


@pytest.mark.parametrize("schedule", [(), ASYNC], ids=["sync", "async"])
def test_filter_through_the_launcher(tmp_path, schedule):
    job = make_tiny_job(str(tmp_path / "job"))
    reward = tmp_path / "split.py"
    reward.write_text(SPLIT_REWARD)
    run_dir = str(tmp_path / "run")
    result = run_train(run_dir, [*job.overrides(steps=2), f"data.reward_fn={reward}:split",
                                 "data.reward_num_workers=0", "data.reward_timeout_s=null",
                                 "trainer.algorithm.dynamic_sampling.type=filter",
                                 "trainer.algorithm.dynamic_sampling.max_sample_batches=20",
                                 "generator.eval_n_samples_per_prompt=3", "trainer.eval_before_train=true",
                                 "generator.eval_temperature=1.0", *schedule])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    rows = read_metrics(f"{run_dir}/metrics.jsonl")
    assert {"val_accuracy", "val_pass@3", "val_mean@3"} <= set(rows[0])
    assert rows[0]["val_mean@3"] == pytest.approx(rows[0]["val_accuracy"])
    assert rows[0]["val_pass@3"] >= rows[0]["val_accuracy"]
    steps = [row for row in rows if "loss" in row]
    assert [row["step"] for row in steps] == [1, 2]
    for row in steps:
        # every batch drawn holds train_batch_size=4 groups; exactly its even rows were dropped
        drawn = 4 * row["dynamic_sampling_batches"]
        assert row["dynamic_sampling_dropped_groups"] == round(row["reward/split/even"] * drawn), row
        # filter stops at the first batch that brings the groups with signal to 4 (so it drew more than one batch
        # in a step that dropped any)
        assert 4 <= drawn - row["dynamic_sampling_dropped_groups"] < 4 + 4, row
    assert sum(row["dynamic_sampling_dropped_groups"] for row in steps) > 0
    if schedule:  # every batch drawn within the staleness bound, whichever step took it
        assert all(row["policy_lag"] <= 1 and row["stale_dropped"] == 0 for row in steps), steps


def test_groups_that_never_differ_end_the_run_naming_the_bound(tmp_path):
    job = make_tiny_job(str(tmp_path / "job"))
    constant = tmp_path / "constant.py"
    constant.write_text("def one(response, answer):\n    return 1.0\n")
    run_dir = str(tmp_path / "run")
    result = run_train(run_dir, [*job.overrides(steps=2), f"data.reward_fn={constant}:one",
                                 "trainer.algorithm.dynamic_sampling.type=filter",
                                 "trainer.algorithm.dynamic_sampling.max_sample_batches=2"])
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-5000:]
    assert "trainer.algorithm.dynamic_sampling: 2 batches generated (max_sample_batches)" in result.stderr
    assert "only 0 of 4 groups" in result.stderr and "at step 1" in result.stderr
