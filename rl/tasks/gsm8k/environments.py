"""SkyRL-gym's GSM8K environments under their SkyRL names, written from `skyrl_gym.envs.gsm8k`:

- `gsm8k`: one turn, graded as SkyRL-gym grades it (`skyrl_grading`: the first `#### N`, compared as text), 1 or 0.
- `gsm8k_multi_turn`: up to `max_turns` answers with a reward every turn: 1.0 for the right answer (which ends the
  episode), `0.2 / max_turns` for a wrong `#### N`, 0 without one. After a wrong turn a user turn asks again: for
  step-by-step reasoning with a tentative `#### ANSWER` while more than one turn remains, for only the final
  `#### ANSWER` before the last. The episode's reward is the sum of its turn rewards.
"""

from __future__ import annotations

from collections.abc import Mapping

from rl.core.data.records import PromptRecord
from rl.core.environments import ENVIRONMENTS, Environment, StepResult
from rl.tasks.gsm8k.skyrl_grading import skyrl_score

DEFAULT_MAX_TURNS = 5
"""SkyRL-gym's turn budget when neither the run nor the row gives one."""
FORMAT_SCORE = 0.2
"""An episode's most format reward: each wrong but well-formed turn earns FORMAT_SCORE / max_turns."""
RETRY_PROMPT = ("Please provide your step-by-step reasoning, "
                "and also include a tentative numeric answer at the end in the exact format: '#### ANSWER'.")
LAST_PROMPT = "Now provide only the final numeric answer in the exact format: '#### ANSWER'."
CHAT_FORMATS = {
    # A user turn and the assistant header after it, written right after the policy's end-of-turn token.
    "chatml": "\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
}
"""How a user turn is written between policy turns, by the chat template of the policy (ChatML: Qwen2.5's)."""


@ENVIRONMENTS.register("gsm8k")
class GSM8kEnv(Environment):
    """SkyRL-gym's single-turn `gsm8k`: one answer, 1.0 when its first `#### N` is the row's answer, else 0."""

    def __init__(self):
        self.answer: str | None = None

    def start(self, record: PromptRecord) -> None:
        self.answer = record.answer

    def step(self, action: str) -> StepResult:
        if self.answer is None:
            raise RuntimeError("gsm8k: step() before start(); start the episode with its data row first")
        return StepResult("", skyrl_score(action, self.answer), True)


@ENVIRONMENTS.register("gsm8k_multi_turn")
class GSM8kMultiTurnEnv(Environment):
    """SkyRL-gym's `gsm8k_multi_turn` (see the module's docstring).

    Args:
        max_turns: the turn budget; None takes the row's `max_turns` column, else its `extra_info.max_turns` (what
            SkyRL's preparation script writes), else 5. Keep it at most generator.max_turns, which ends episodes
            regardless.
        chat_format: the policy's chat template, for the user turns written between its turns: `chatml` (Qwen2.5
            and other ChatML models) or `llama3`.

    Metrics: `steps` (turns taken, SkyRL-gym's metric) and `solved` (1 once the right answer was given).
    """

    def __init__(self, max_turns: int | None = None, chat_format: str = "chatml"):
        if max_turns is not None and (not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1):
            raise ValueError(f"gsm8k_multi_turn: max_turns must be an integer >= 1 or null, got {max_turns!r}")
        if chat_format not in CHAT_FORMATS:
            raise ValueError(f"gsm8k_multi_turn: chat_format is {chat_format!r}; pick one of {', '.join(CHAT_FORMATS)}")
        self.configured_turns, self.user_turn = max_turns, CHAT_FORMATS[chat_format]
        self.answer: str | None = None
        self.max_turns = max_turns or DEFAULT_MAX_TURNS
        self.turns = 0
        self.done = False

    def start(self, record: PromptRecord) -> None:
        self.answer = record.answer
        self.max_turns = self.configured_turns or row_max_turns(record) or DEFAULT_MAX_TURNS
        self.turns = 0
        self.done = False

    def step(self, action: str) -> StepResult:
        if self.answer is None:
            raise RuntimeError("gsm8k_multi_turn: step() before start(); start the episode with its data row first")
        if self.done:
            raise RuntimeError("gsm8k_multi_turn: step() after the episode ended; build a new one per episode")
        self.turns += 1
        reward = skyrl_score(action, self.answer, format_score=FORMAT_SCORE / self.max_turns, score=1.0)
        solved = reward == 1.0
        self.done = solved or self.turns >= self.max_turns
        observation = "" if self.done else self.user_turn.format(content=self.prompt())
        return StepResult(observation, reward, self.done, {"steps": float(self.turns), "solved": float(solved)})

    def prompt(self) -> str:
        return RETRY_PROMPT if self.max_turns - self.turns > 1 else LAST_PROMPT


def row_max_turns(record: PromptRecord) -> int | None:
    """The row's turn budget: its `max_turns` column, else `extra_info.max_turns`; None when it gives none."""
    extra = record.fields.get("extra_info")
    value = record.fields.get("max_turns")
    if value is None and isinstance(extra, Mapping):
        value = extra.get("max_turns")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"gsm8k_multi_turn: {record.where or 'the row'} gives max_turns {value!r}; it must be an "
                         "integer >= 1")
    return value
