"""What a data row's own `env_class` (SkyRL's per-row column) means in this run, as in SkyRL: it names the
environment that plays the row's episodes, in place of environment.env_class. A single-turn run scores every row
with data.reward_fn, so there a row may name only SkyRL-gym's single-turn `gsm8k` when data.reward_fn is its
grading (`gsm8k_skyrl`); anything else is refused naming the file and row, before anything starts."""

from __future__ import annotations

import functools
from collections.abc import Callable

from rl.core.environments import ENVIRONMENTS, Environment, make_environment_factory


def env_class_check(cfg) -> Callable[[str], str | None]:
    """The check `load_prompt_dataset` runs on each row's env_class: the problem with it here, or None."""
    env = cfg.environment
    from rl.tasks import environments as _task_environments  # noqa: F401  (registers the tasks' environments)

    def check(name: str) -> str | None:
        if env.agent_fn is not None:
            return (f"names an environment, but environment.agent_fn ({env.agent_fn}) plays every episode here; "
                    "drop the row's env_class or set environment.agent_fn=null")
        if env.env_class is None:
            if name == "gsm8k" and list(cfg.data.reward_fn) == ["gsm8k_skyrl"]:
                return None
            grading = (" or data.reward_fn=gsm8k_skyrl (its grading, scored without an episode)"
                       if name == "gsm8k" else "")
            return (f"names an environment, but this run is single-turn (environment.env_class is null) and scores "
                    f"every row with data.reward_fn {list(cfg.data.reward_fn)}; set environment.env_class={name} "
                    f"to play the row in it{grading}")
        if name == env.env_class or name in ENVIRONMENTS:
            return None
        return f"is no environment here: {ENVIRONMENTS.unknown_message(name)}; fix the row or register the class"

    return check


def row_environment_factory() -> Callable[[str], Callable[[], Environment]]:
    """Builds (once per name) the factory of a registered environment a row names; it takes no env_options,
    which belong to environment.env_class."""

    @functools.cache
    def factory(name: str) -> Callable[[], Environment]:
        return make_environment_factory(name, f"a data row's env_class {name!r}")

    return factory
