"""GSM8K verifier: find the final number in a response and compare it exactly with the reference answer.

Modes (`ANSWER_EXTRACTORS`):
- "strict": the number right after the last `####` (GSM8K's own format); anything else scores 0.
- "flexible": the final answer however phrased. Markers are tried in this order, each taking its last occurrence:
  `#### N`; `\\boxed{N}`; an answer phrase (`The answer is N`, `Final answer: N`, `answer = N`, `A: N`). With no
  marker, the last number in the text.
Both modes read numbers with `rl.tasks.gsm8k.numbers` (separators, currency, units, decimals and fractions).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from rl.core.registry import Registry
from rl.core.rewards.registry import REWARD_FUNCTIONS
from rl.tasks.gsm8k.numbers import NUMBER, clean_latex, format_number, last_number, number_value, parse_number

HASH_MARKER = "####"
_CONNECTOR = r"\s*(?:is|was|=|:|would\s+be|will\s+be)[\s:*]*"
# Explicit final-answer markers, strongest first; each regex's NUMBER groups hold the answer.
FLEXIBLE_MARKERS: tuple[re.Pattern[str], ...] = (
    re.compile(r"####[\s*]*" + NUMBER),
    re.compile(r"\\boxed\s*\{\s*" + NUMBER + r"[^{}]*\}"),
    re.compile(r"(?:(?i:\b(?:final\s+)?answer)" + _CONNECTOR + r"|(?<!\w)A\s*:[\s*]*)" + NUMBER),
)

ANSWER_EXTRACTORS: Registry[Callable[[str], Fraction | None]] = Registry("answer extraction mode")


@ANSWER_EXTRACTORS.register("strict")
def strict_value(text: str) -> Fraction | None:
    """The number right after the last `####`, or None when there is no `####` or no number follows it."""
    if HASH_MARKER not in text:
        return None
    return parse_number(text.rsplit(HASH_MARKER, 1)[1])


@ANSWER_EXTRACTORS.register("flexible")
def flexible_value(text: str) -> Fraction | None:
    """The number after the strongest final-answer marker (its last occurrence), else the last number."""
    text = clean_latex(text)
    for marker in FLEXIBLE_MARKERS:
        values = [number_value(match) for match in marker.finditer(text)]
        values = [value for value in values if value is not None]
        if values:
            return values[-1]
    return last_number(text)


def extract_answer(text: str, mode: str = "strict") -> str | None:
    """The final answer in `text` as a canonical number string ("1234", "3.5", "1/3"), or None if none is found."""
    extractor = ANSWER_EXTRACTORS.get(mode)
    if not isinstance(text, str):
        return None
    value = extractor(text)
    return None if value is None else format_number(value)


def answer_reward(response: str, answer: str, mode: str) -> float:
    """1.0 when the response's final number (per `mode`) equals `answer` exactly, else 0.0; never raises on input."""
    if not isinstance(response, str) or not isinstance(answer, str):
        return 0.0
    expected = parse_number(answer)
    if expected is None:
        return 0.0
    return 1.0 if ANSWER_EXTRACTORS.get(mode)(response) == expected else 0.0


@REWARD_FUNCTIONS.register("gsm8k")
def gsm8k_reward(response: str, answer: str) -> float:
    """GSM8K strict: the number after the last `####` must equal the answer."""
    return answer_reward(response, answer, "strict")


@REWARD_FUNCTIONS.register("gsm8k_flexible")
def gsm8k_flexible_reward(response: str, answer: str) -> float:
    """GSM8K flexible: the final answer however phrased must equal the answer."""
    return answer_reward(response, answer, "flexible")
