"""Multi-turn rollouts, token in and token out: the policy and an environment take turns until the episode ends.

Each episode's context is its prompt ids followed by everything since, kept as token ids the whole way: the
engine's response ids are appended exactly as sampled and the environment's observation text is encoded once and
appended, so earlier text is never re-tokenized (re-tokenizing can merge or split tokens differently, and the
trainer would then score tokens the policy never sampled). A mask marks which tokens the policy wrote, so the
trainer computes its loss on those only.

Batching: the first turn is one engine call with every prompt and `params.n` samples each; every later turn is one
call with one sample per still-active episode, listed in trajectory order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl.core.data.records import PromptRecord
from rl.core.environments import Environment, StepResult
from rl.core.generation.engine import Rollout, SamplingParams

Generate = Callable[[list[list[int]], SamplingParams], list[Rollout]]


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
            a turn short, or left no room for the next observation and at least one new token).
        metrics: the environment's metrics from its last step.
        response_text: the last policy turn, decoded with special tokens skipped.
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

    @property
    def context_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def context(self) -> list[int]:
        """What the next turn is sampled after: the prompt and every response token so far."""
        return self.prompt_ids + self.response_ids


def run_episodes(
    generate: Generate,
    tokenizer: Any,
    make_env: Callable[[], Environment],
    records: Sequence[PromptRecord],
    prompt_ids: Sequence[list[int]],
    params: SamplingParams,
    max_turns: int,
    max_context_tokens: int,
) -> list[Trajectory]:
    """Play `params.n` episodes per record, one fresh environment each; trajectories come back prompt-major.

    `generate` has `GenerationEngine.generate`'s signature; `prompt_ids[i]` is `records[i]`'s encoded prompt.
    Every turn's max_new_tokens is capped so that no context exceeds `max_context_tokens`. One call serves every
    active episode, so the cap is the smallest room left among them, and a turn it cuts short ends its episode
    ("context") even when that episode had more room. When `params.seed` is set, turn t (from 0) samples with
    seed `params.seed + t`.
    """
    check_arguments(records, prompt_ids, max_turns, max_context_tokens)
    n = params.n
    episodes = [Trajectory(p, s, list(prompt_ids[p])) for p in range(len(records)) for s in range(n)]
    environments = [start_environment(make_env, records[episode.prompt_index]) for episode in episodes]
    active = list(range(len(episodes)))
    turn = 0
    while active:
        contexts = [episodes[i].context() for i in active]
        turn_params = params_for_turn(params, turn, contexts, max_context_tokens)
        rollouts = generate(contexts, turn_params) if turn else generate(list(map(list, prompt_ids)), turn_params)
        if len(rollouts) != len(contexts):
            raise RuntimeError(f"the engine returned {len(rollouts)} rollouts for {len(contexts)} episodes")
        still_active = []
        for rollout in rollouts:
            # First turn: prompt-major samples map to episodes by (prompt, sample); later: one per active episode.
            index = rollout.prompt_index * n + rollout.sample_index if turn == 0 else active[rollout.prompt_index]
            if take_turn(episodes[index], environments[index], rollout, tokenizer, params.max_new_tokens, max_turns,
                         max_context_tokens):
                still_active.append(index)
        active = sorted(still_active)
        turn += 1
    return episodes


def check_arguments(
    records: Sequence[PromptRecord], prompt_ids: Sequence[list[int]], max_turns: int, max_context_tokens: int
) -> None:
    if len(records) != len(prompt_ids):
        raise ValueError(f"run_episodes got {len(records)} records but {len(prompt_ids)} encoded prompts")
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
    for index, ids in enumerate(prompt_ids):
        if len(ids) >= max_context_tokens:
            raise ValueError(f"prompt {index} has {len(ids)} tokens, leaving no room for a response under "
                             f"max_context_tokens={max_context_tokens}; raise the limit or shorten the prompt")


def start_environment(make_env: Callable[[], Environment], record: PromptRecord) -> Environment:
    environment = make_env()
    environment.start(record)
    return environment


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


def take_turn(
    episode: Trajectory,
    environment: Environment,
    rollout: Rollout,
    tokenizer: Any,
    max_new_tokens: int,
    max_turns: int,
    max_context_tokens: int,
) -> bool:
    """Append the policy's turn, step the environment on it, and append its observation unless the episode ends
    here; returns whether the episode goes on."""
    if len(rollout.rollout_logprobs) != len(rollout.response_ids):
        raise RuntimeError(f"the engine returned {len(rollout.rollout_logprobs)} logprobs for "
                           f"{len(rollout.response_ids)} response tokens")
    episode.response_ids.extend(rollout.response_ids)
    episode.response_mask.extend([True] * len(rollout.response_ids))
    episode.rollout_logprobs.extend(float(logprob) for logprob in rollout.rollout_logprobs)
    episode.turns += 1
    text = tokenizer.decode(rollout.response_ids, skip_special_tokens=True)
    result = checked(environment.step(text), environment)
    episode.reward += float(result.reward)
    episode.metrics = dict(result.metrics)
    episode.response_text = text
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


def checked(result: Any, environment: Environment) -> StepResult:
    """User environments are loaded from config, so a wrong return type is reported by class name."""
    if not isinstance(result, StepResult):
        raise TypeError(f"{type(environment).__name__}.step returned {type(result).__name__}, not a StepResult")
    return result
