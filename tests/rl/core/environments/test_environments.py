"""The environment registry (names, user references, refusals) and the built-in `arith_retry` environment."""

from __future__ import annotations

import textwrap

import pytest

import rl.tasks.environments  # noqa: F401  (registers the tasks' environments)
from rl.core.data import ChatMessage, PromptRecord
from rl.core.environments import ENVIRONMENTS, Environment, StepResult, make_environment_factory
from rl.tasks.embedded import build_tokenizer
from rl.tasks.embedded.retry_env import ArithRetryEnv

KEY = "environment.name"
RECORD = PromptRecord((ChatMessage("user", "What is 38 + 47?"),), "85", "synthetic/arith", 0)
RIGHT, WRONG = "8+7=15 3+4+1=8 #### 85", "8+7=15 3+4=7 #### 75"


def test_registered_name_builds_a_fresh_environment_each_call():
    factory = make_environment_factory("arith_retry", KEY)
    first, second = factory(), factory()
    assert isinstance(first, ArithRetryEnv) and first is not second
    assert "arith_retry" in ENVIRONMENTS.names()


def test_unknown_name_suggests_the_closest_and_names_the_key():
    with pytest.raises(ValueError, match=r"environment\.name: unknown environment 'arith_retyr'.*Did you mean "
                                         r"'arith_retry'"):
        make_environment_factory("arith_retyr", KEY)


def test_options_are_passed_to_the_class():
    environment = make_environment_factory("arith_retry", KEY, {"attempts": 3, "retry_reward": 0.25})()
    assert (environment.attempts, environment.retry_reward) == (3, 0.25)


def test_user_file_reference_loads_its_class(tmp_path):
    path = tmp_path / "my_env.py"
    path.write_text(textwrap.dedent("""
        from rl.core.environments import Environment, StepResult

        class Echo(Environment):
            def start(self, record):
                self.answer = record.answer

            def step(self, action):
                return StepResult(observation="", reward=float(action == self.answer), done=True)

        def not_a_class():
            return Echo()
    """))
    environment = make_environment_factory(f"{path}:Echo", KEY)()
    environment.start(RECORD)
    assert environment.step("85") == StepResult("", 1.0, True)
    with pytest.raises(ValueError, match=r"environment\.name: .*not a subclass of rl\.core\.environments"):
        make_environment_factory(f"{path}:not_a_class", KEY)
    with pytest.raises(ValueError, match=r"environment\.name: .* has no 'Missing'"):
        make_environment_factory(f"{path}:Missing", KEY)


def test_non_environment_classes_and_abstract_ones_are_refused():
    with pytest.raises(ValueError, match=r"environment\.name: .*not a subclass"):
        make_environment_factory("collections:OrderedDict", KEY)

    class Half(Environment):
        def start(self, record: PromptRecord) -> None:
            pass

    ENVIRONMENTS.register("half_for_test")(Half)
    try:
        with pytest.raises(ValueError, match=r"environment\.name: .*does not implement step"):
            make_environment_factory("half_for_test", KEY)
    finally:
        ENVIRONMENTS.remove("half_for_test")


def play(actions: list[str], **options) -> list[StepResult]:
    environment = ArithRetryEnv(**options)
    environment.start(RECORD)
    return [environment.step(action) for action in actions]


def test_right_first_time_earns_one_and_ends():
    (result,) = play([RIGHT])
    assert (result.reward, result.done, result.observation) == (1.0, True, "")
    assert result.metrics == {"solved": 1.0, "attempts": 1.0}


def test_wrong_then_right_earns_the_retry_reward():
    first, second = play([WRONG, RIGHT])
    assert (first.reward, first.done) == (0.0, False)
    assert first.metrics == {"solved": 0.0, "attempts": 1.0}
    assert first.observation == "<|user|>What is 38 + 47?<|end|><|assistant|>"
    assert (second.reward, second.done, second.metrics) == (0.5, True, {"solved": 1.0, "attempts": 2.0})
    assert first.reward + second.reward == 0.5


def test_wrong_every_time_earns_nothing_and_ends_after_the_last_attempt():
    results = play([WRONG, "####", "no answer"], attempts=3)
    assert [r.reward for r in results] == [0.0, 0.0, 0.0]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].metrics == {"solved": 0.0, "attempts": 3.0}
    two = play([WRONG, WRONG])
    assert [(r.reward, r.done) for r in two] == [(0.0, False), (0.0, True)]


def test_stepping_outside_an_episode_is_refused():
    with pytest.raises(RuntimeError, match="before start"):
        ArithRetryEnv().step(RIGHT)
    environment = ArithRetryEnv()
    environment.start(RECORD)
    environment.step(RIGHT)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        environment.step(RIGHT)


@pytest.mark.parametrize("prompt", [RECORD.prompt, "What is 9 + 10?"])
def test_observations_use_only_the_embedded_vocabulary(prompt):
    tokenizer = build_tokenizer()
    environment = ArithRetryEnv(attempts=3)
    environment.start(PromptRecord(prompt, "1", "synthetic/arith", 1))
    observations = [environment.step(WRONG).observation for _ in range(2)]
    for observation in observations:
        ids = tokenizer.encode(observation, add_special_tokens=False)
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == observation
        assert "<|unk|>" not in tokenizer.decode(ids)
