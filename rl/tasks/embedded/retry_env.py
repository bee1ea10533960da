"""`arith_retry`: the embedded arithmetic task with a second chance, a small multi-turn environment.

The policy answers the addition; the strict GSM8K verifier grades the answer. A right first answer ends the
episode with reward 1. A wrong answer, while attempts remain, is answered by asking the question again (a new
user turn, written only with tokens the embedded tokenizer knows, so it encodes without `<|unk|>`); a right answer
on a later attempt earns `retry_reward` (0.5 by default), less than getting it right at once, so retrying pays but
first-time accuracy pays more. A wrong last attempt ends the episode with reward 0.
"""

from __future__ import annotations

from rl.core.data.records import PromptRecord
from rl.core.environments import ENVIRONMENTS, Environment, StepResult
from rl.tasks.embedded.tokenizer import EOS
from rl.tasks.gsm8k.rewards import gsm8k_reward

USER, ASSISTANT = "<|user|>", "<|assistant|>"


@ENVIRONMENTS.register("arith_retry")
class ArithRetryEnv(Environment):
    """Up to `attempts` answers to one addition; reward 1 when the first is right, `retry_reward` when a later one is.

    Metrics (every step): `solved` (1 once a right answer was given, else 0) and `attempts` (answers so far).
    """

    def __init__(self, attempts: int = 2, retry_reward: float = 0.5):
        if not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"arith_retry: attempts must be an integer >= 1, got {attempts!r}")
        self.attempts = attempts
        self.retry_reward = float(retry_reward)
        self.question: str | None = None
        self.answer = ""
        self.used = 0
        self.done = False

    def start(self, record: PromptRecord) -> None:
        # The question is the last user message (a plain-text prompt is one); the retry repeats it.
        users = [message["content"] for message in record.messages() if message["role"] == "user"]
        self.question = users[-1] if users else record.messages()[-1]["content"]
        self.answer = record.answer
        self.used = 0
        self.done = False

    def step(self, action: str) -> StepResult:
        if self.question is None:
            raise RuntimeError("arith_retry: step() before start(); start the episode with its data row first")
        if self.done:
            raise RuntimeError("arith_retry: step() after the episode ended; build a new environment per episode")
        self.used += 1
        solved = gsm8k_reward(action, self.answer) == 1.0
        self.done = solved or self.used >= self.attempts
        reward = (1.0 if self.used == 1 else self.retry_reward) if solved else 0.0
        observation = "" if self.done else self.retry_prompt()
        return StepResult(observation, reward, self.done, {"solved": float(solved), "attempts": float(self.used)})

    def retry_prompt(self) -> str:
        """A new user turn asking the question again, then the assistant marker the next answer follows."""
        return f"{USER}{self.question}{EOS}{ASSISTANT}"
