"""The rollout queue's episode jobs (multi-turn episodes generated ahead, `EpisodeJobs`) with scripted engines
whose weights change between turns: a batch's version is its oldest turn's, a batch older than the bound is
played again, and an episode's error reaches the step that takes the batch. (Real engines and episodes:
test_async_training's multi-turn runs.)"""

import threading

import pytest

from rl.core.data import BatchPosition, PromptBatch, PromptRecord
from rl.trainer.rollout.rollout_queue import EpisodeJobs, RolloutQueue


class ScriptedEngines:
    """Each call answers with the version the engines hold when it is collected."""

    def __init__(self):
        self.version, self.first_turns = 0, threading.Semaphore(0)

    def submit(self, prompts, params):
        return list(prompts)

    def collect(self, pending):
        return [self.version], [f"response to {p}" for p in pending]


class TwoTurnEpisodes:
    """Two engine calls per batch; the second waits for `gate` (the test pushes weights before opening it)."""

    def __init__(self, engines, fail: bool = False):
        self.engines, self.fail, self.gate = engines, fail, threading.Event()

    def run(self, generate, records, prompts, params):
        first = generate(prompts, params)
        self.engines.first_turns.release()
        self.gate.wait(timeout=30)
        if self.fail:
            raise RuntimeError("the environment failed")
        return first + generate(prompts, params)


def _batch(index: int) -> PromptBatch:
    record = PromptRecord(prompt=f"q{index}", answer="1", data_source="t", index=index)
    return PromptBatch((record,), BatchPosition(0, index), BatchPosition(0, index + 1))


def _queue(episodes, engines, bound: int) -> RolloutQueue:
    drawn = iter(range(100))
    queue = RolloutQueue(EpisodeJobs(engines, episodes), lambda: _batch(next(drawn)),
                         lambda batch: ([[1, 2]], None), lambda step: None, bound)
    queue.start(1, engine_version=0)
    return queue


def test_a_batch_takes_the_version_of_its_oldest_turn():
    engines = ScriptedEngines()
    episodes = TwoTurnEpisodes(engines)
    queue = _queue(episodes, engines, bound=1)
    queue.fill(3)  # batches 1 and 2: (2 - 1) - 0 <= 1
    for _ in range(2):
        assert engines.first_turns.acquire(timeout=30)
    engines.version = 1  # step 1's weights reach the engines between the turns
    episodes.gate.set()
    _, rollouts, row = queue.take(1)
    assert (len(rollouts), row["policy_lag"], row["stale_dropped"]) == (2, 0, 0)
    batch, _, row = queue.take(2)
    # the second turn ran on version 1, the first on 0: the batch lags step 2's policy (1 update) by 1, not 0
    assert (batch.start.index, row["policy_lag"], row["stale_dropped"]) == (1, 1, 0)
    queue.close()


def test_a_batch_older_than_the_bound_is_played_again():
    engines = ScriptedEngines()
    episodes = TwoTurnEpisodes(engines)
    queue = _queue(episodes, engines, bound=0)
    queue.fill(2)  # batch 1 only
    queue._submit()  # batch 2 as well, on version 0, which the bound would not allow
    for _ in range(2):
        assert engines.first_turns.acquire(timeout=30)
    episodes.gate.set()
    queue.take(1)
    engines.version = 1
    _, rollouts, row = queue.take(2)  # played on version 0 for step 2 (lag 1 > 0): played again on version 1
    assert (len(rollouts), row["policy_lag"], row["stale_dropped"]) == (2, 0, 2)
    queue.close()


def test_an_episode_error_reaches_the_step():
    engines = ScriptedEngines()
    episodes = TwoTurnEpisodes(engines, fail=True)
    queue = _queue(episodes, engines, bound=1)
    queue.fill(2)
    episodes.gate.set()
    with pytest.raises(RuntimeError, match="the environment failed"):
        queue.take(1)
    queue.close()
