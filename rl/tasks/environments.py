"""Importing this module registers every task's multi-turn environments in `rl.core.environments.ENVIRONMENTS`,
under the names config takes. Code that looks an environment up by name imports it first."""

from rl.tasks.embedded import retry_env as _embedded_retry_env  # noqa: F401  (registers arith_retry)
from rl.tasks.gsm8k import environments as _gsm8k_environments  # noqa: F401  (registers gsm8k, gsm8k_multi_turn)
