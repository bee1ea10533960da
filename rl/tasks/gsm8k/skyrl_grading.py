"""SkyRL-gym's GSM8K grading (`skyrl_gym.envs.gsm8k.utils.compute_score`, strict method), reproduced so that its
`gsm8k` and `gsm8k_multi_turn` environments score here what they score there.

The answer is the first `#### N` in the response (`####`, one space, then digits, `.`, `,` and a leading `-`), with
commas removed, compared as text with the ground truth: `#### 72` matches "72", `#### 72.` and `#### 72.0` do not.
A correct answer scores `score`; a `#### N` that is wrong scores `format_score`; no `#### N` scores 0. This differs
from the `gsm8k` reward (the last `####`, compared as numbers); `gsm8k_skyrl` is this grading as a reward.
"""

from __future__ import annotations

import re

from rl.core.rewards.registry import REWARD_FUNCTIONS

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def strict_answer(response: str) -> str | None:
    """The first `#### N`'s number as SkyRL-gym reads it (commas and `$` removed), or None when there is none."""
    match = STRICT.search(response)
    return None if match is None else match.group(1).replace(",", "").replace("$", "")


def skyrl_score(response: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0) -> float:
    """`score` for the right answer, `format_score` for a wrong `#### N`, 0.0 without one; never raises."""
    if not isinstance(response, str):
        return 0.0
    answer = strict_answer(response)
    if answer is None:
        return 0.0
    return float(score) if answer == str(ground_truth) else float(format_score)


@REWARD_FUNCTIONS.register("gsm8k_skyrl")
def gsm8k_skyrl_reward(response: str, answer: str) -> float:
    """SkyRL-gym's single-turn `gsm8k` environment as a reward: 1 when the first `#### N` is the answer (as text),
    else 0 (its format score is 0)."""
    return skyrl_score(response, answer)
