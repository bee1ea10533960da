"""The table of reward functions, picked by name from config: `REWARD_FUNCTIONS.get("gsm8k")(response, answer)`."""

from __future__ import annotations

from collections.abc import Callable

from rl.core.registry import Registry

# A reward function scores one response against the reference answer; it returns a float and never raises.
RewardFunction = Callable[[str, str], float]
REWARD_FUNCTIONS: Registry[RewardFunction] = Registry("reward function")
