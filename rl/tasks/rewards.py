"""Importing this module registers every task's reward functions in `rl.core.rewards.REWARD_FUNCTIONS`, under the
names `data.reward_fn` takes. Code that looks a reward function up by name imports it first."""

from rl.tasks import code_exec as _code_exec  # noqa: F401  (registers python_expression)
from rl.tasks.gsm8k import rewards as _gsm8k_rewards  # noqa: F401  (registers gsm8k, gsm8k_flexible)
from rl.tasks.gsm8k import skyrl_grading as _skyrl_grading  # noqa: F401  (registers gsm8k_skyrl)
