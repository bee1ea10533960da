"""SkyRL-gym's GSM8K environments as built in here, against hand-worked episodes of its code's behaviour
(skyrl_gym/envs/gsm8k: utils.compute_score's strict method, env.py, multi_turn_env.py)."""

from __future__ import annotations

import pytest

import rl.tasks.environments  # registers gsm8k and gsm8k_multi_turn
import rl.tasks.rewards  # noqa: F401  (registers gsm8k_skyrl)
from rl.core.data import PromptRecord
from rl.core.environments import make_environment_factory
from rl.core.rewards.registry import REWARD_FUNCTIONS
from rl.tasks.gsm8k.environments import LAST_PROMPT, RETRY_PROMPT
from rl.tasks.gsm8k.skyrl_grading import skyrl_score

CHATML_USER = "\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def row(answer: str = "72", **fields) -> PromptRecord:
    return PromptRecord("How many clips?", answer, "openai/gsm8k", 0, fields=fields, where="train.parquet row 0")


@pytest.mark.parametrize(("response", "truth", "expected"), [
    ("48 + 24 = 72\n#### 72", "72", 1.0),
    ("#### 1,000", "1000", 1.0),  # commas removed
    ("#### -3", "-3", 1.0),
    ("#### 72.", "72", 0.5),  # compared as text: a trailing period is a wrong, well-formed answer
    ("#### 72.0", "72", 0.5),
    ("#### 5 then #### 72", "72", 0.5),  # the first `#### N` counts
    ("####72", "72", 0.0),  # no space after ####: no answer at all
    ("#### $72", "72", 0.0),  # `$` is not a number character, so nothing follows `#### `
    ("the answer is 72", "72", 0.0),
])
def test_strict_grading(response, truth, expected):
    assert skyrl_score(response, truth, format_score=0.5) == expected
    assert REWARD_FUNCTIONS.get("gsm8k_skyrl")(response, truth) == (1.0 if expected == 1.0 else 0.0)


def test_single_turn_gsm8k_is_one_graded_step():
    env = make_environment_factory("gsm8k", "environment.env_class")()
    env.start(row())
    result = env.step("so #### 72")
    assert (result.reward, result.done, result.observation) == (1.0, True, "")
    env.start(row())
    assert env.step("#### 71").reward == 0.0  # its format score is 0


def test_multi_turn_retry_prompts_turn_rewards_and_the_right_answer_ends_it():
    env = make_environment_factory("gsm8k_multi_turn", "environment.env_class", {"max_turns": 3})()
    env.start(row())
    first = env.step("I think it is 70")  # no `#### N`: 0; two turns remain: the reasoning prompt
    assert (first.reward, first.done, first.observation) == (0.0, False, CHATML_USER.format(RETRY_PROMPT))
    second = env.step("#### 70")  # wrong but well formed: 0.2 / 3; one turn remains: the final-answer prompt
    assert second.reward == pytest.approx(0.2 / 3) and not second.done
    assert second.observation == CHATML_USER.format(LAST_PROMPT)
    third = env.step("#### 72")
    assert (third.reward, third.done, third.observation) == (1.0, True, "")
    assert third.metrics == {"steps": 3.0, "solved": 1.0}
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("#### 72")


def test_multi_turn_ends_when_out_of_turns_or_right_at_once():
    env = make_environment_factory("gsm8k_multi_turn", "environment.env_class", {"max_turns": 2})()
    env.start(row())
    rewards = [env.step("#### 1"), env.step("#### 2")]
    assert [r.reward for r in rewards] == pytest.approx([0.1, 0.1]) and [r.done for r in rewards] == [False, True]
    env.start(row())
    assert env.step("#### 72").done and env.turns == 1


def test_multi_turn_budget_comes_from_options_then_the_row_then_five():
    make = make_environment_factory("gsm8k_multi_turn", "environment.env_class")
    env = make()
    env.start(row(extra_info={"max_turns": 2, "split": "train"}))  # what SkyRL's preparation script writes
    assert env.max_turns == 2 and env.step("#### 1").reward == pytest.approx(0.1)
    env.start(row())
    assert env.max_turns == 5
    env = make_environment_factory("gsm8k_multi_turn", "k", {"max_turns": 4, "chat_format": "llama3"})()
    env.start(row(max_turns=2))
    assert env.max_turns == 4
    assert env.step("#### 1").observation.startswith("<|start_header_id|>user<|end_header_id|>\n\n" + RETRY_PROMPT)
    with pytest.raises(ValueError, match="chat_format is 'zephyr'"):
        make_environment_factory("gsm8k_multi_turn", "k", {"chat_format": "zephyr"})()
    with pytest.raises(ValueError, match=r"train\.parquet row 0 gives max_turns 0"):
        make().start(row(extra_info={"max_turns": 0}))
