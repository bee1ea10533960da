"""The multi-turn environment interface: a policy turn's text in, an observation and a reward out.

An environment runs one episode per instance. The trainer encodes the data row's prompt as the policy's first
observation, then alternates: the policy writes a turn, the environment answers it with `step`. Environments speak
text, and the rollout loop (`rl.trainer.multi_turn.turns`) handles tokens, so one environment works with any tokenizer
whose vocabulary covers what it writes.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from rl.core.data.records import PromptRecord


@dataclass(frozen=True)
class StepResult:
    """What the environment answers to one policy turn.

    Attributes:
        observation: text appended verbatim right after the policy's tokens (the policy's turn ends with its stop
            token when it produced one). The environment writes any chat markers itself, e.g.
            `<|user|>feedback<|end|><|assistant|>` so that the next policy turn starts where the chat template
            would put an assistant reply. Ignored when `done`.
        reward: this step's reward, a number (an int, float or numpy/torch scalar; text such as "1.0" is refused,
            not converted); an episode's reward is the sum of its step rewards. A NaN or infinite one is handled
            as trainer.non_finite says.
        done: True ends the episode (a bool).
        metrics: finite numbers by name to log about the episode; the rollout loop keeps the last step's.

    Anything else `step` returns (a tuple, None, a wrong field type) fails the episode, as data.reward_on_error says.
    """

    observation: str
    reward: float
    done: bool
    metrics: dict[str, float] = field(default_factory=dict)


class Environment(abc.ABC):
    """One episode of a multi-turn task. Build a fresh instance per episode; `start` comes first, then `step`
    once per policy turn until a result says `done` (or the rollout loop stops the episode for turns or length).

    The instances of a batch are built, started and stepped side by side on threads (environment.max_env_workers),
    each call within environment.step_timeout_s; an exception from any of them fails that episode, named by the
    class, the data row and the turn, and handled as data.reward_on_error says."""

    @abc.abstractmethod
    def start(self, record: PromptRecord) -> None:
        """Reset to the episode of `record`. The policy's first observation is the record's prompt, which the
        trainer encodes (chat template included), so `start` returns nothing."""

    @abc.abstractmethod
    def step(self, action: str) -> StepResult:
        """Answer the policy's last turn; `action` is that turn's tokens decoded with special tokens skipped."""
