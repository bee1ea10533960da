"""The run's multi-turn side (`environment.env_class`): one episode per sample, its reward the environment's, and
the context limit the episodes play within."""

from __future__ import annotations

from torch import Tensor

from rl.core.environments import make_environment_factory
from rl.trainer.multi_turn.row_environments import row_environment_factory
from rl.trainer.multi_turn.turns import EnvSettings, Trajectory, context_limit, run_episodes, trajectory_means


class Episodes:
    def __init__(self, make_env, tokenizer, max_turns: int, max_context_tokens: int,
                 settings: EnvSettings | None = None):
        self.make_env, self.tokenizer, self.settings = make_env, tokenizer, settings or EnvSettings()
        self.max_turns, self.max_context_tokens = max_turns, max_context_tokens

    @classmethod
    def from_config(cls, cfg, tokenizer, model_path: str) -> Episodes | None:
        env = cfg.environment
        if env.agent_fn is not None:  # agent code plays the episodes through the endpoint
            from rl.trainer.multi_turn.agents import AgentEpisodes

            return AgentEpisodes.from_config(cfg, tokenizer, model_path)
        if env.env_class is None:
            return None
        from rl.tasks import environments as _task_environments  # noqa: F401  (registers the tasks' environments)

        make_env = make_environment_factory(env.env_class, "environment.env_class", env.env_options)
        settings = EnvSettings(max_workers=env.max_env_workers, step_timeout_s=env.step_timeout_s,
                               on_error=cfg.data.reward_on_error, reference=env.env_class,
                               row_environment=row_environment_factory())
        return cls(make_env, tokenizer, cfg.generator.max_turns, context_limit(cfg, model_path), settings)

    def run(self, generate, records, prompts: list[list[int]], params) -> list[Trajectory]:
        return run_episodes(generate, self.tokenizer, self.make_env, records, prompts, params, self.max_turns,
                            self.max_context_tokens, self.settings)

    @staticmethod
    def rewards(trajectories: list[Trajectory]) -> tuple[Tensor, dict[str, float]]:
        """[B] episode rewards, and the means of turns, of the environments' last-step metrics (env/<name>) and of
        each way the episodes finished (finish/<reason>); reward_errors counts the episodes whose environment
        failed (data.reward_on_error=zero)."""
        rewards, means = trajectory_means(trajectories, [t.turns for t in trajectories], "env")
        means["reward_errors"] = float(sum(bool(t.error) for t in trajectories))
        return rewards, means
