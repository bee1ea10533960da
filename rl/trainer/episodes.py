"""The run's multi-turn side (`environment.env_class`): one episode per sample, its reward the environment's, and
the context limit the episodes play within."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from rl.core.environments import make_environment_factory
from rl.trainer.multi_turn import EnvSettings, Trajectory, run_episodes
from rl.trainer.row_environments import row_environment_factory


def context_limit(cfg, model_path: str) -> int:
    """generator.max_input_length, or prompt + max_turns turns, never past the model's positions."""
    from transformers import AutoConfig

    gen = cfg.generator
    limit = gen.max_input_length or gen.max_prompt_length + gen.max_turns * gen.max_generate_length
    positions = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    return min(limit, positions) if positions else limit


class Episodes:
    def __init__(self, make_env, tokenizer, max_turns: int, max_context_tokens: int,
                 settings: EnvSettings | None = None):
        self.make_env, self.tokenizer, self.settings = make_env, tokenizer, settings or EnvSettings()
        self.max_turns, self.max_context_tokens = max_turns, max_context_tokens

    @classmethod
    def from_config(cls, cfg, tokenizer, model_path: str) -> Episodes | None:
        env = cfg.environment
        if env.agent_fn is not None:  # agent code plays the episodes through the endpoint
            from rl.trainer.agents import AgentEpisodes

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


def trajectory_means(trajectories, turns: list[int], prefix: str) -> tuple[Tensor, dict[str, float]]:
    """[B] rewards of `trajectories`, and the means over them of `turns` (turns_mean), of each way they finished
    (finish/<reason>) and of their own metrics (<prefix>/<name>)."""
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    sums: dict[str, float] = defaultdict(float)
    for t, count in zip(trajectories, turns, strict=True):
        sums["turns_mean"] += count
        sums[f"finish/{t.finish_reason}"] += 1
        for name, value in t.metrics.items():
            sums[f"{prefix}/{name}"] += float(value)
    count = max(len(trajectories), 1)
    return rewards, {name: value / count for name, value in sums.items()}
