"""Generation on devices of its own and overlapping training, through the launcher on the tiny job.

Oracles: the synchronous run on the same placement (`trainer.fully_async` with max_staleness_steps=0 must give the
same metrics at every step; both runs play multi-turn episodes, which the queue plays in a thread of its own), the
staleness bound itself (each step's `policy_lag`, the version the engines reported for its
rollouts, never exceeds it, and reaches it once the queue is full), the uninterrupted run for one whose engine is
lost while training runs ahead of it (every step's numbers to the bit). Learning asynchronously:
`test_async_default_job.py`."""

import itertools
import os
import re

import pytest

from rl.trainer.state import checkpoint
from rl.trainer.state.faults import SEGMENT_DELAY
from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import make_tiny_job, run_train

STEPS = 4
COMPARED = ("reward_mean", "loss", "pg_loss", "grad_norm", "kl", "entropy")
SEPARATE = ["trainer.placement.colocate_all=false"]
EPISODES = ["environment.env_class=arith_retry", "generator.max_turns=2"]


def _asynchronous(bound: int) -> list[str]:
    return [*SEPARATE, "trainer.fully_async.enabled=true", f"trainer.fully_async.max_staleness_steps={bound}"]


def _nemo_asynchronous(bound: int) -> list[str]:
    """The same schedule in NeMo RL's spelling."""
    return [*SEPARATE, "grpo.async_grpo.enabled=true", f"grpo.async_grpo.max_trajectory_age_steps={bound}"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


def _run(job, run_dir: str, extra: list[str], steps: int = STEPS, env_extra: dict | None = None
         ) -> tuple[list[dict], str]:
    result = run_train(run_dir, [*job.overrides(steps=steps), "data.reward_fn=gsm8k_flexible",
                                 "trainer.algorithm.use_entropy_loss=true", *extra], env_extra=env_extra)
    assert result.returncode == 0, result.stderr[-5000:]
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [row["step"] for row in rows] == list(range(1, steps + 1))
    return rows, result.stdout


@pytest.fixture(scope="module")
def separate(job, tmp_path_factory):
    return _run(job, str(tmp_path_factory.mktemp("separate")), [*SEPARATE, *EPISODES])


def test_engine_on_its_own_core(separate):
    """Placed as said. That the placement changes no number (the same seeds, weights and micro-batches) is
    test_critic_training's `fsdp2-critic-group-2w`, whose engine sits on a core of its own beside a colocated
    reference."""
    _, stdout = separate
    assert "1 engine(s) on their own 1 device(s) each (CPU cores: engines [(0,)], workers [1])" in stdout
    assert "hf engine on engine 0:" in stdout and "CPU cores [0]" in stdout


def test_no_staleness_is_the_synchronous_schedule_whatever_the_transport_and_reference(job, separate, tmp_path):
    """`max_staleness_steps=0` is the synchronous schedule; and on the way, what must not change a number either:
    the weights through Ray's object store instead of the default gloo group (same bytes), the reference model on a
    group of two workers of its own (`colocate_policy_ref=false`, its logprob pass beside the policy's) instead of on
    the policy's worker, and the engine SIGKILLed by its first call at policy version 1 (a turn of step 2's episodes,
    played in the queue's thread), replaced and the call issued again (trainer.max_restarts). Same metrics as the
    synchronous run at every step."""
    rows, stdout = _run(job, str(tmp_path / "async0"),
                        [*_asynchronous(0), *EPISODES, "generator.weight_sync_backend=ray",
                         "trainer.placement.colocate_policy_ref=false", "trainer.placement.ref_num_gpus_per_node=2",
                         "trainer.max_restarts=1"],
                        env_extra={"RL_KILL_AT": "engine_generate:1", "RL_KILL_ONCE": str(tmp_path / "killed")})
    assert re.search(r"^warning: generation engine 0 \(.*\) died \(ActorDiedError: .*\) at step 2; replaced in .* "
                     r"1 call\(s\) issued again with their seeds", stdout, re.M), stdout[-3000:]
    assert [row["engines_replaced"] for row in rows] == [0, 1, 1, 1] and rows[-1]["restarts"] == 0
    assert "weight sync: ray" in stdout
    assert "the reference model on 2 worker(s) of its own (1 x 2)" in stdout
    assert stdout.count("reference workers: rank 0:") == 1 and "rank 1:" in stdout.split("reference workers:")[1]
    expected, expected_stdout = separate
    assert "weight sync: gloo" in expected_stdout
    assert any(row["kl"] != 0 for row in rows)
    assert all(row["turns_mean"] > 1 for row in rows), "episodes of more than one turn"
    for row, want in zip(rows, expected, strict=True):
        assert row["policy_lag"] == 0 and row["stale_dropped"] == 0
        assert row["sync_bytes"] > 0 and row["sync_buckets"] == want["sync_buckets"]
        for key in COMPARED:
            assert row[key] == pytest.approx(want[key], rel=1e-5, abs=1e-8), (row["step"], key)


def _positions_after_each_batch(job, steps: int) -> list[tuple[int, int]]:
    """(epoch, index) after 1..steps batches of the tiny job's prompts, in the order a run draws them."""
    from rl.core.data import iter_batches, load_prompt_dataset

    batches = iter_batches(load_prompt_dataset([job.train_data]), 4, seed=42)
    return [(batch.next_position.epoch, batch.next_position.index) for batch in itertools.islice(batches, steps)]


@pytest.fixture(scope="module")
def bound_two(job, tmp_path_factory) -> tuple[list[dict], str]:
    """A run with rollouts up to 2 steps behind (`_nemo_asynchronous(2)`), a checkpoint at every step: its rows and
    run directory."""
    run_dir = str(tmp_path_factory.mktemp("async2"))
    return _run(job, run_dir, [*_nemo_asynchronous(2), "trainer.ckpt_interval=1"])[0], run_dir


def test_rollouts_never_lag_more_than_the_bound(job, bound_two):
    """Bound 2 (bound 1 is the embedded default's run below), set with NeMo RL's keys (`grpo.async_grpo.*`); the
    resumed run sets it with ours, with partial rollouts (segments of 2 tokens, a weight push landing between them:
    the bound holds for every token, and the responses split between two versions are counted).
    Also: a checkpoint saves the data position after the last trained batch, not after the queued ones, and a run
    resumed from one regenerates the queue from the restored weights."""
    rows, run_dir = bound_two
    bound = 2
    assert [row["policy_lag"] for row in rows] == [min(bound, step - 1) for step in range(1, STEPS + 1)]
    assert all(row["stale_dropped"] == 0 for row in rows)
    assert all(row["queued_batches"] <= bound for row in rows)
    root = os.path.join(run_dir, "checkpoints")
    saved = [checkpoint.read_trainer_state(checkpoint.step_dir(root, step)) for step in range(1, STEPS + 1)]
    assert [(state["epoch"], state["index"]) for state in saved] == _positions_after_each_batch(job, STEPS)
    # segments of 2 tokens, 0.5 s apart (RL_SEGMENT_DELAY_S, in the engine actor): a batch's 6 segments take 3 s,
    # longer than the training step beside them, so step 3's weight push lands mid-response in batch 4
    result = run_train(run_dir, [*job.overrides(steps=STEPS), "data.reward_fn=gsm8k_flexible",
                                 "trainer.algorithm.use_entropy_loss=true", *_asynchronous(bound),
                                 "trainer.fully_async.partial_rollout_tokens=2",
                                 f"trainer.resume_mode={checkpoint.step_dir(root, 2)}"],
                       env_extra={SEGMENT_DELAY: "0.5"})
    assert result.returncode == 0, result.stderr[-5000:]
    resumed = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    assert [row["step"] for row in resumed] == list(range(1, STEPS + 1)), "each step once"
    assert resumed[:2] == rows[:2], "the steps before the checkpoint stay as they were"
    third, fourth = resumed[2:]
    assert [third["policy_lag"], fourth["policy_lag"]] == [0, 1], "the queue starts again from step 3"
    # batch 3 is generated before anything is pushed: one version (2) throughout
    assert (third["partial_responses"], third["token_lag_mean"]) == (0.0, 0.0), third
    # batch 4 began under version 2 and went on under version 3: its split responses are those still sampling at
    # the push, each token weighed against the version that sampled it (lag 1 before the push, 0 after)
    responses = 4 * 4  # the tiny job's prompts x samples
    split = fourth["partial_responses"] * responses
    assert split == int(split) and 1 <= split <= responses, fourth
    assert 0 < fourth["token_lag_mean"] < 1, fourth


def test_engine_lost_with_rollouts_queued_ahead(job, bound_two, tmp_path):
    """Bound 2: batches 1-3 go to the engine at once, under version 0. The engine is SIGKILLed as it starts batch 2,
    while step 1 trains; the loss is found by step 1's weight push, which waits for the engine's calls. By then rank 0
    holds version 1, so the replacement must get the copy of version 0 rank 0 kept, and batches 2 and 3 issued again
    under it: every step's numbers as in the uninterrupted run of the test above, to the bit. Batch 1 may be lost
    too (then the loss is found as it is collected, before step 1): Ray sends a call's result after its method
    returns, so batch 1's reply can die with the engine; issued again, its seeds give the same rollouts."""
    expected, _ = bound_two
    rows, stdout = _run(job, str(tmp_path / "killed"),
                        [*_nemo_asynchronous(2), "trainer.ckpt_interval=1", "trainer.max_restarts=1"],
                        env_extra={"RL_KILL_AT": "engine_generate:0:2", "RL_KILL_ONCE": str(tmp_path / "killed.mark")})
    assert "rank 0 keeps a host copy of the weights the engines hold" in stdout
    assert re.search(r"^warning: generation engine 0 \(.*\) died \(ActorDiedError: .*\) at step 1; replaced in .* "
                     r"[23] call\(s\) issued again with their seeds", stdout, re.M), stdout[-3000:]
    assert [row["engines_replaced"] for row in rows] == [1, 1, 1, 1] and rows[-1]["restarts"] == 0
    for row, want in zip(rows, expected, strict=True):
        assert row["policy_lag"] == want["policy_lag"]
        assert {key: row[key] for key in COMPARED} == {key: want[key] for key in COMPARED}, row["step"]
