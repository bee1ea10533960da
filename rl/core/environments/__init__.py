"""Multi-turn environments: the `Environment` interface, its `StepResult`, and the `ENVIRONMENTS` registry.

Importing `rl.tasks.environments` registers the tasks' built-in environments (e.g. `arith_retry`).
"""

from rl.core.environments.base import Environment, StepResult
from rl.core.environments.registry import ENVIRONMENTS, make_environment_factory

__all__ = ["ENVIRONMENTS", "Environment", "StepResult", "make_environment_factory"]
