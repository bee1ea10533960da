"""Reward functions, registered by name in `REWARD_FUNCTIONS`: `fn(response: str, answer: str) -> float`.

The tasks define and register them (rl/tasks); importing `rl.tasks.rewards` registers every task's functions.
"""

from rl.core.rewards.registry import REWARD_FUNCTIONS, RewardFunction

__all__ = ["REWARD_FUNCTIONS", "RewardFunction"]
