"""An LLM judge as a reward: a template asks a model to grade each response, a regex reads the grade from its reply.

The judge runs through any `GenerationEngine` (greedy, one `generate` call per batch), so it works with whichever
engine serves the policy. Templates and patterns are checked up front, so a typo in a placeholder or a regex without
a capture group fails at config load rather than as a run of unparseable grades.
"""

from __future__ import annotations

import math
import re
import string
from typing import Any

from rl.core.generation.engine import GenerationEngine, SamplingParams

JUDGE_FIELDS = ("prompt", "response", "answer")


def check_template(template: str, key: str) -> None:
    """Refuse a template with a placeholder other than JUDGE_FIELDS, or without `{response}`; errors name `key`."""
    allowed = ", ".join("{" + field + "}" for field in JUDGE_FIELDS)
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as error:
        raise ValueError(f"{key}: the template is not a valid format string ({error}); "
                         "write {{ and }} for literal braces") from error
    for name in fields:
        if name not in JUDGE_FIELDS:
            raise ValueError(f"{key}: unknown placeholder {{{name}}}; allowed: {allowed} "
                             "(write {{ and }} for literal braces)")
    if "response" not in fields:
        raise ValueError(f"{key}: the template has no {{response}} placeholder, so the judge would never see the "
                         f"response it grades; allowed placeholders: {allowed}")


def check_pattern(pattern: str, key: str) -> None:
    """Refuse a regex that does not compile or has no capture group (the group holds the score)."""
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ValueError(f"{key}: {pattern!r} is not a valid regular expression: {error}") from error
    if compiled.groups < 1:
        raise ValueError(f"{key}: {pattern!r} has no capture group; wrap the score in parentheses, e.g. "
                         r"'Score: (\d+)'")


def parse_score(text: str, pattern: str) -> float | None:
    """The first capture group of the last match of `pattern` in `text`, as a finite float; None when nothing matches
    or the group is not a number. The last match wins because judges tend to reason first and grade at the end."""
    matches = list(re.finditer(pattern, text))
    if not matches or matches[-1].group(1) is None:
        return None
    try:
        value = float(matches[-1].group(1))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


class JudgeReward:
    """Grades responses with a language model behind a `GenerationEngine`.

    Each row's template is rendered with its prompt, response and answer, sent as a single user turn through the
    tokenizer's chat template (or encoded as plain text), and answered greedily; the score is `parse_score` of the
    reply.

    Args:
        engine: the engine serving the judge model.
        tokenizer: the judge model's tokenizer.
        template: format string over {prompt}, {response} and {answer}; must contain {response}.
        pattern: regex whose first capture group is the score.
        max_new_tokens: longest reply the judge may write.
        use_chat_template: True requires a chat template, False encodes plain text, None uses one when the tokenizer
            has it.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        template: str,
        pattern: str,
        max_new_tokens: int = 64,
        use_chat_template: bool | None = None,
    ):
        check_template(template, "template")
        check_pattern(pattern, "pattern")
        has_template = getattr(tokenizer, "chat_template", None) is not None
        if use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the judge's tokenizer has no chat template")
        self.engine = engine
        self.tokenizer = tokenizer
        self.template = template
        self.pattern = pattern
        self.use_chat_template = has_template if use_chat_template is None else use_chat_template
        self.params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens)

    def render(self, prompt: str, response: str, answer: str) -> str:
        return self.template.format(prompt=prompt, response=response, answer=answer)

    def encode(self, text: str) -> list[int]:
        """Token ids of one judge request; the chat template adds its own special tokens, so none are added here."""
        if self.use_chat_template:
            messages = [{"role": "user", "content": text}]
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def score(self, prompts: list[str], responses: list[str], answers: list[str]) -> list[float | None]:
        """One score per row, None where the judge's reply has no parseable score (callers count those)."""
        if not len(prompts) == len(responses) == len(answers):
            raise ValueError(f"got {len(prompts)} prompts, {len(responses)} responses and {len(answers)} answers; "
                             "give one of each per row")
        if not prompts:
            return []
        encoded = [self.encode(self.render(*row)) for row in zip(prompts, responses, answers, strict=True)]
        rollouts = sorted(self.engine.generate(encoded, self.params), key=lambda rollout: rollout.prompt_index)
        return [parse_score(rollout.response_text, self.pattern) for rollout in rollouts]
