"""Partial rollouts: a generation call run as segments of at most `segment_tokens` new tokens each, so that new
weights can land between two segments of a response instead of after the whole call
(`trainer.fully_async.partial_rollout_tokens`).

A response still open after a segment (cut by the segment's length, not by a stop token or the call's budget) goes
on from the tokens already sampled: its prompt and response so far are the next segment's prompt (re-prefilled
with whatever weights the engine then holds), one sample each. Every token keeps the policy version of the segment
that sampled it (`Rollout.token_versions`) and the logprobs of the distribution it was sampled from, so the
off-policy correction weighs each token against its own behaviour policy. A stop string that a segment boundary
splits is found on the whole response, as a single call would find it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from rl.core.generation.engine import Rollout, SamplingParams
from rl.core.generation.sequences import cut_at_stop_string

SEED_STRIDE = 1_000_003  # segment k of a seeded call samples with seed * SEED_STRIDE + k

# (prompts, params) -> (the policy version of the weights used, the rollouts)
RunSegment = Callable[[list[list[int]], SamplingParams], tuple[int, list[Rollout]]]


def generate_in_segments(run: RunSegment, prompts: list[list[int]], params: SamplingParams, segment_tokens: int,
                         decode: Callable[[Sequence[int]], str]) -> tuple[int, list[Rollout]]:
    """`params.n` rollouts per prompt, prompt-major, generated `segment_tokens` at a time; returns (the oldest
    policy version any token was sampled with, the rollouts with their `token_versions`). `decode` turns response
    ids into text (special tokens skipped) for `response_text` and stop strings."""
    if segment_tokens < 1:
        raise ValueError(f"segment_tokens must be >= 1, got {segment_tokens}")
    budget = params.max_new_tokens
    version, rollouts = run(prompts, dataclasses.replace(params, max_new_tokens=min(segment_tokens, budget)))
    oldest = version
    for rollout in rollouts:
        rollout.token_versions = [version] * len(rollout.response_ids)
    open_ = [r for r in rollouts if _goes_on(r, budget, params, decode)]
    segment = 1
    while open_:
        length = len(open_[0].response_ids)  # every open response filled each segment so far
        seed = None if params.seed is None else params.seed * SEED_STRIDE + segment
        step = dataclasses.replace(params, n=1, seed=seed, max_new_tokens=min(segment_tokens, budget - length))
        version, parts = run([r.prompt_ids + r.response_ids for r in open_], step)
        oldest = min(oldest, version)
        for rollout, part in zip(open_, parts, strict=True):
            _extend(rollout, part, version)
        open_ = [r for r in open_ if _goes_on(r, budget, params, decode)]
        segment += 1
    if segment > 1:  # the texts of responses that spanned segments, whole
        for rollout in rollouts:
            rollout.response_text = decode(rollout.response_ids)
    return oldest, rollouts


def _extend(rollout: Rollout, part: Rollout, version: int) -> None:
    rollout.response_ids = rollout.response_ids + part.response_ids
    rollout.rollout_logprobs = rollout.rollout_logprobs + part.rollout_logprobs
    rollout.raw_logprobs = (None if rollout.raw_logprobs is None or part.raw_logprobs is None
                            else rollout.raw_logprobs + part.raw_logprobs)
    rollout.token_versions = rollout.token_versions + [version] * len(part.response_ids)
    rollout.finish_reason = part.finish_reason


def _goes_on(rollout: Rollout, budget: int, params: SamplingParams, decode) -> bool:
    """Whether a response continues in the next segment; one that completed a stop string across a segment
    boundary is cut there and finishes with "stop"."""
    cut = cut_at_stop_string(rollout.response_ids, decode, params.stop) if params.stop else None
    if cut is None:
        return rollout.finish_reason == "length" and len(rollout.response_ids) < budget
    for field in ("response_ids", "rollout_logprobs", "raw_logprobs", "token_versions"):
        value = getattr(rollout, field)
        if value is not None:
            setattr(rollout, field, value[:cut])
    rollout.finish_reason = "stop"
    return False
