"""Reward functions, registered by name in `REWARD_FUNCTIONS`: `fn(response: str, answer: str) -> float`."""

from rl.core.rewards import gsm8k as _gsm8k  # noqa: F401  (registers the GSM8K rewards)
from rl.core.rewards.gsm8k import extract_answer
from rl.core.rewards.registry import REWARD_FUNCTIONS, RewardFunction

__all__ = ["REWARD_FUNCTIONS", "RewardFunction", "extract_answer"]
