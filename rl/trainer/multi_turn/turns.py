"""Multi-turn rollouts, token in and token out: the policy and an environment take turns until the episode ends.

Each episode's context is its prompt ids followed by everything since, kept as token ids the whole way: the
engine's response ids are appended exactly as sampled and the environment's observation text is encoded once and
appended, so earlier text is never re-tokenized (re-tokenizing can merge or split tokens differently, and the
trainer would then score tokens the policy never sampled). A mask marks which tokens the policy wrote, so the
trainer computes its loss on those only.

Batching: the first turn is one engine call with every prompt and `params.n` samples each; every later turn is one
call with one sample per still-active episode, listed in trajectory order. The environments' calls of a turn run
side by side (`env_calls.CallPool`), and a failed one is handled as data.reward_on_error says (`EnvSettings`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rl.core.data.records import PromptRecord, describe_row
from rl.core.environments import Environment, StepResult
from rl.core.generation.engine import Rollout, SamplingParams
from rl.trainer.multi_turn.env_calls import CallPool, EpisodeError, Outcome, checked_result, describe_failure
from rl.trainer.rewards.rewarding import SHOWN_ERRORS

Generate = Callable[[list[list[int]], SamplingParams], list[Rollout]]


def context_limit(cfg, model_path: str) -> int:
    """generator.max_input_length, or prompt + max_turns turns, never past the model's positions."""
    from transformers import AutoConfig

    gen = cfg.generator
    limit = gen.max_input_length or gen.max_prompt_length + gen.max_turns * gen.max_generate_length
    positions = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    return min(limit, positions) if positions else limit


@dataclass
class Trajectory:
    """One finished episode.

    Attributes:
        prompt_index: which prompt (of the `records` given to `run_episodes`) the episode started from.
        sample_index: which of that prompt's `params.n` samples this is.
        prompt_ids: the prompt's token ids.
        response_ids: every token after the prompt, in order: policy turns and the observations between them.
        response_mask: per response token, True where the policy wrote it, False on observation tokens.
        rollout_logprobs: per response token, the engine's rollout logprob on policy tokens and 0.0 on observations.
        reward: the sum of the environment's step rewards.
        turns: policy turns taken.
        finish_reason: "stop" (the environment ended it), "length" (a turn hit `params.max_new_tokens` and the
            environment did not end the episode), "max_turns" (the turn limit), or "context" (the context limit cut
            a turn short, or left no room for the next observation and at least one new token), or "error" (a call
            into its environment failed, with data.reward_on_error=zero: the episode scores 0).
        metrics: the environment's metrics from its last step.
        response_text: the last policy turn, decoded with special tokens skipped.
        error: what failed, when finish_reason is "error".
    """

    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[bool] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    finish_reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    response_text: str = ""
    error: str = ""

    @property
    def context_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def context(self) -> list[int]:
        """What the next turn is sampled after: the prompt and every response token so far."""
        return self.prompt_ids + self.response_ids


@dataclass(frozen=True)
class EnvSettings:
    """How the environments are called.

    Attributes:
        max_workers: threads that run their calls side by side (`environment.max_env_workers`).
        step_timeout_s: seconds one call may take (`environment.step_timeout_s`); None: no limit.
        on_error: `data.reward_on_error`: `fail` ends the run at a failed call; `zero` ends that episode with
            reward 0, and only a batch whose every episode failed ends the run.
        reference: `environment.env_class` as configured, for messages.
        row_environment: builds the factory of the environment a row's own `env_class` names, which plays that
            row's episodes in place of `make_env` (SkyRL's rule); None: every episode uses `make_env`.
    """

    max_workers: int = 1
    step_timeout_s: float | None = None
    on_error: str = "fail"
    reference: str = ""
    row_environment: Callable[[str], Callable[[], Environment]] | None = None


def run_episodes(
    generate: Generate,
    tokenizer: Any,
    make_env: Callable[[], Environment],
    records: Sequence[PromptRecord],
    prompt_ids: Sequence[list[int]],
    params: SamplingParams,
    max_turns: int,
    max_context_tokens: int,
    settings: EnvSettings = EnvSettings(),
) -> list[Trajectory]:
    """Play `params.n` episodes per record, one fresh environment each; trajectories come back prompt-major.

    `generate` has `GenerationEngine.generate`'s signature; `prompt_ids[i]` is `records[i]`'s encoded prompt.
    Every turn's max_new_tokens is capped so that no context exceeds `max_context_tokens`. One call serves every
    active episode, so the cap is the smallest room left among them, and a turn it cuts short ends its episode
    ("context") even when that episode had more room. When `params.seed` is set, turn t (from 0) samples with
    seed `params.seed + t`. A failed environment call raises `EpisodeError` or ends its episode, as
    `settings.on_error` says.
    """
    check_arguments(records, prompt_ids, max_turns, max_context_tokens)
    n = params.n
    episodes = [Trajectory(p, s, list(prompt_ids[p])) for p in range(len(records)) for s in range(n)]
    calls = EnvironmentCalls(make_env, records, episodes, settings)
    environments = calls.start()
    active = list(range(len(episodes)))
    turn = 0
    while active:
        contexts = [episodes[i].context() for i in active]
        turn_params = params_for_turn(params, turn, contexts, max_context_tokens)
        rollouts = generate(contexts, turn_params) if turn else generate(list(map(list, prompt_ids)), turn_params)
        if len(rollouts) != len(contexts):
            raise RuntimeError(f"the engine returned {len(rollouts)} rollouts for {len(contexts)} episodes")
        # First turn: prompt-major samples map to episodes by (prompt, sample); later: one per active episode.
        played = {(r.prompt_index * n + r.sample_index if turn == 0 else active[r.prompt_index]): r for r in rollouts}
        actions = {index: append_turn(episodes[index], rollout, tokenizer) for index, rollout in played.items()}
        results = calls.step({i: (environments[i], action) for i, action in actions.items()
                              if environments[i] is not None})
        active = [index for index in sorted(played)
                  if index in results and answer_turn(episodes[index], results[index], played[index], tokenizer,
                                                      params.max_new_tokens, max_turns, max_context_tokens)]
        turn += 1
    calls.report()
    return episodes


def check_arguments(
    records: Sequence[PromptRecord], prompt_ids: Sequence[list[int]], max_turns: int, max_context_tokens: int
) -> None:
    if len(records) != len(prompt_ids):
        raise ValueError(f"run_episodes got {len(records)} records but {len(prompt_ids)} encoded prompts")
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
    for record, ids in zip(records, prompt_ids, strict=True):
        if len(ids) >= max_context_tokens:
            raise EpisodeError(no_room_message(describe_row(record), len(ids), max_context_tokens))


def no_room_message(where: str, length: int, max_context_tokens: int) -> str:
    return (f"the prompt of {where} has {length} tokens, leaving no room for a response within an episode's "
            f"{max_context_tokens} tokens of context; raise generator.max_input_length (at most the model's "
            "max_position_embeddings), lower generator.max_prompt_length (prompts are cut to it as data.truncation "
            "says) or shorten the prompt")


def environment_class_name(make_env: Callable[[], Environment]) -> str:
    """The class `make_env` builds (a class, or a functools.partial of one), as messages name it."""
    target = make_env.func if isinstance(make_env, functools.partial) else make_env
    return getattr(target, "__qualname__", type(target).__name__)


class EnvironmentCalls:
    """The environments of one `run_episodes`: built, started and stepped on a `CallPool`, each failure raised as
    an `EpisodeError` or recorded on its episode (`settings.on_error`)."""

    def __init__(self, make_env, records: Sequence[PromptRecord], episodes: list[Trajectory], settings: EnvSettings):
        self.make_env, self.records, self.episodes, self.settings = make_env, records, episodes, settings
        self.pool = CallPool(settings.max_workers, settings.step_timeout_s)
        self.class_name = environment_class_name(make_env)
        self.factories = [self.factory(self.record(i)) for i in range(len(episodes))]

    def factory(self, record: PromptRecord) -> Callable[[], Environment]:
        """The row's own environment when it names one other than the run's, else the run's."""
        name = record.env_class
        if name is None or name == self.settings.reference or self.settings.row_environment is None:
            return self.make_env
        return self.settings.row_environment(name)

    def start(self) -> list[Environment | None]:
        """One environment per episode, started on its record; None where building or starting it failed."""
        everyone = range(len(self.episodes))
        built = self.run("__init__", {i: self.factories[i] for i in everyone})
        started = self.run("start", {i: functools.partial(built[i].start, self.record(i)) for i in built})
        return [built[i] if i in started else None for i in everyone]

    def step(self, moves: dict[int, tuple[Environment, str]]) -> dict[int, StepResult]:
        """Each environment's checked answer to its action; episodes whose step failed are left out."""
        return self.run("step", {i: functools.partial(_checked_step, env, action)
                                 for i, (env, action) in moves.items()})

    def run(self, call: str, functions: dict[int, Callable[[], Any]]) -> dict[int, Any]:
        """The values of the calls that succeeded, by episode; each failure raised or recorded."""
        indices = list(functions)
        outcomes = self.pool.run([functions[i] for i in indices], stop_on_failure=self.settings.on_error == "fail")
        values = {}
        for index, outcome in zip(indices, outcomes, strict=True):
            if outcome is None:
                continue  # not finished when an earlier failure stopped the batch
            if outcome.failed:
                self.fail(index, call, outcome)
            else:
                values[index] = outcome.value
        return values

    def fail(self, index: int, call: str, outcome: Outcome) -> None:
        problem, fix = describe_failure(outcome, call, self.settings.step_timeout_s)
        episode = self.episodes[index]
        position = f"turn {episode.turns}" if call == "step" else "before the first turn"
        record, class_name = self.record(index), environment_class_name(self.factories[index])
        named = f"env_class={record.env_class}" if self.factories[index] is not self.make_env else (
            f"environment.env_class={self.settings.reference or self.class_name}")
        line = (f"{named}: {class_name}.{call} on "
                f"{describe_row(record)} (sample {episode.sample_index}, {position}) {problem}")
        if outcome.fatal:
            raise EpisodeError(line)
        if self.settings.on_error == "fail":
            raise EpisodeError(f"{line}; {fix} (or set data.reward_on_error=zero to score such episodes 0 and go on)")
        episode.error, episode.reward, episode.metrics = line, 0.0, {}
        finish(episode, "error")

    def record(self, index: int) -> PromptRecord:
        return self.records[self.episodes[index].prompt_index]

    def report(self) -> None:
        """With data.reward_on_error=zero: a warning for the first few failed episodes; a batch of nothing but
        failures ends the run (there is nothing to learn from)."""
        failed = [episode.error for episode in self.episodes if episode.error]
        if failed and len(failed) == len(self.episodes):
            raise EpisodeError(f"all {len(failed)} episodes of this batch failed, the first: {failed[0]}; "
                               "data.reward_on_error=zero scores a failed episode 0, but a batch with no working "
                               "episode has nothing to train on: fix the environment")
        for line in failed[:SHOWN_ERRORS]:
            print(f"warning: {line}; scored 0 (data.reward_on_error=zero)", flush=True)


def _checked_step(environment: Environment, action: str) -> StepResult:
    return checked_result(environment.step(action))


def params_for_turn(
    params: SamplingParams, turn: int, contexts: list[list[int]], max_context_tokens: int
) -> SamplingParams:
    """The first turn samples `params.n` per prompt; later turns one per episode. The cap keeps the longest
    context within the limit; the per-turn seed keeps later turns from replaying the first turn's random draws."""
    room = min(max_context_tokens - len(context) for context in contexts)
    changes: dict[str, Any] = {"max_new_tokens": min(params.max_new_tokens, room)}
    if turn:
        changes["n"] = 1
        if params.seed is not None:
            changes["seed"] = params.seed + turn
    return dataclasses.replace(params, **changes)


def append_turn(episode: Trajectory, rollout: Rollout, tokenizer: Any) -> str:
    """Append the policy's turn to its episode; returns the turn's text (the environment's action)."""
    if len(rollout.rollout_logprobs) != len(rollout.response_ids):
        raise RuntimeError(f"the engine returned {len(rollout.rollout_logprobs)} logprobs for "
                           f"{len(rollout.response_ids)} response tokens")
    episode.response_ids.extend(rollout.response_ids)
    episode.response_mask.extend([True] * len(rollout.response_ids))
    episode.rollout_logprobs.extend(float(logprob) for logprob in rollout.rollout_logprobs)
    episode.turns += 1
    text = tokenizer.decode(rollout.response_ids, skip_special_tokens=True)
    episode.response_text = text
    if episode.error:  # its environment never started: the episode ends with this turn
        finish(episode, "error")
    return text


def answer_turn(
    episode: Trajectory,
    result: StepResult,
    rollout: Rollout,
    tokenizer: Any,
    max_new_tokens: int,
    max_turns: int,
    max_context_tokens: int,
) -> bool:
    """Take the environment's answer to the turn just appended, and append its observation unless the episode ends
    here; returns whether the episode goes on."""
    episode.reward += float(result.reward)
    episode.metrics = {name: float(value) for name, value in result.metrics.items()}
    if result.done:
        return finish(episode, "stop")
    if rollout.finish_reason == "length":
        # A turn cut off mid-way is not a reply to answer. Shorter than max_new_tokens: the context cap cut it.
        return finish(episode, "length" if len(rollout.response_ids) >= max_new_tokens else "context")
    if episode.turns >= max_turns:
        return finish(episode, "max_turns")
    observation = tokenizer.encode(result.observation, add_special_tokens=False)
    if episode.context_length + len(observation) + 1 > max_context_tokens:
        return finish(episode, "context")
    episode.response_ids.extend(observation)
    episode.response_mask.extend([False] * len(observation))
    episode.rollout_logprobs.extend([0.0] * len(observation))
    return True


def finish(episode: Trajectory, reason: str) -> bool:
    episode.finish_reason = reason
    return False


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
