"""Token in, token out for the agent endpoint: an episode's calls, recorded as token ids, and the trajectories they
make.

Each call's prompt is built from the episode's earlier tokens where it can be: when a chat call's messages are the
previous call's messages, its reply (as the endpoint returned it) and new messages after them, the prompt is the
previous call's prompt ids and sampled ids exactly as they were, followed by the chat template's text for what came
after the reply (its end-of-turn marker when the sampled ids lack it, the new messages, the generation prompt),
encoded once. Earlier tokens are never re-tokenized, so the trainer scores exactly the tokens the policy sampled. A
call that does not extend the previous one (the agent rewrote its history, or a completion prompt that does not
start with the previous prompt and completion) starts a new chain: each chain becomes one trajectory of the
episode, and they share its reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl.trainer.multi_turn.turns import Trajectory


@dataclass
class RecordedCall:
    """One endpoint call: what was sent (messages, or a completion prompt's text / ids) and what the engine did.

    Attributes:
        messages: the chat messages as (role, content) pairs; None for a completion call.
        prompt_text: a completion call's prompt as text (None when it was given as token ids, or for chat).
        prompt_ids: the token ids the engine was given.
        response_ids: the token ids the engine sampled, as sampled.
        logprobs: per sampled token, the engine's rollout logprob.
        version: the policy version (weight updates received) of the weights that sampled it.
        finish_reason: "stop" or "length".
        text: the sampled ids decoded with special tokens skipped (what the agent got back).
        extends: whether `prompt_ids` starts with the previous call's prompt and sampled ids.
    """

    messages: tuple[tuple[str, str], ...] | None
    prompt_text: str | None
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version: int = 0
    finish_reason: str = "stop"
    text: str = ""
    extends: bool = False

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids


def message_pairs(messages: Any) -> tuple[tuple[str, str], ...]:
    """OpenAI chat messages as (role, text) pairs: content given as a list of parts keeps its text parts, joined.
    Raises ValueError naming what is malformed."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content} objects")
    pairs = []
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{position}] must be an object with a string 'role'")
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content
                              if isinstance(part, dict) and part.get("type") == "text")
        if not isinstance(content, str):
            raise ValueError(f"messages[{position}].content must be a string or a list of text parts")
        pairs.append((message["role"], content))
    return tuple(pairs)


def _template(tokenizer: Any, pairs, generation_prompt: bool) -> str:
    messages = [{"role": role, "content": content} for role, content in pairs]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def chat_prompt(tokenizer: Any, pairs: tuple[tuple[str, str], ...], previous: RecordedCall | None) -> RecordedCall:
    """The call for chat `pairs`: continuing `previous` token for token where the messages extend it, else the
    whole conversation templated and encoded (a new chain)."""
    if previous is not None and previous.messages is not None:
        before = previous.messages
        reply = ("assistant", previous.text)
        if len(pairs) > len(before) + 1 and pairs[:len(before) + 1] == (*before, reply):
            bridge = _chat_bridge(tokenizer, before, reply, pairs, previous.response_ids)
            if bridge is not None:
                return RecordedCall(pairs, None, previous.context + _encode(tokenizer, bridge), extends=True)
    return RecordedCall(pairs, None, _encode(tokenizer, _template(tokenizer, pairs, True)))


def _chat_bridge(tokenizer: Any, before, reply, pairs, sampled_ids: list[int]) -> str | None:
    """The templated text between the sampled ids and the new call's generation prompt's end, or None when the
    template does not lay the conversation out as a continuation of itself."""
    asked = _template(tokenizer, before, True)
    answered = _template(tokenizer, (*before, reply), False)
    full = _template(tokenizer, pairs, True)
    if not (answered.startswith(asked) and full.startswith(answered)):
        return None
    reply_part = answered[len(asked):]
    sampled = tokenizer.decode(sampled_ids, skip_special_tokens=False)
    if not reply_part.startswith(sampled):
        return None  # the template rewrites the reply (e.g. strips it): the tokens cannot be kept
    return reply_part[len(sampled):] + full[len(answered):]


def completion_prompt(tokenizer: Any, prompt: Any, previous: RecordedCall | None) -> RecordedCall:
    """The call for a completion prompt (text, or a list of token ids): a text prompt that starts with the previous
    call's prompt text and completion keeps their ids; token ids are taken as given."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        extends = previous is not None and prompt[:len(previous.context)] == previous.context
        return RecordedCall(None, None, list(prompt), extends=extends)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("'prompt' must be a non-empty string or a list of token ids (one prompt per request)")
    if previous is not None and previous.prompt_text is not None:
        # the completion as sampled, or as the endpoint returned it (special tokens skipped)
        for completion in (tokenizer.decode(previous.response_ids, skip_special_tokens=False), previous.text):
            done = previous.prompt_text + completion
            if prompt.startswith(done):
                return RecordedCall(None, prompt, previous.context + _encode(tokenizer, prompt[len(done):]),
                                    extends=True)
    return RecordedCall(None, prompt, _encode(tokenizer, prompt))


@dataclass
class AgentTrajectory(Trajectory):
    """A trajectory played through the endpoint: `versions` holds, per response token, the policy version that
    sampled it (-1 on the tokens between calls, which the policy did not write); `episode` numbers the episode
    within its batch, and `calls` counts the endpoint calls it is made of."""

    versions: list[int] = field(default_factory=list)
    episode: int = 0
    calls: int = 0


def trajectories_of(calls: list[RecordedCall], prompt_index: int, sample_index: int,
                    episode: int) -> list[AgentTrajectory]:
    """One trajectory per chain of calls that extend each other, in the order the chains started."""
    out: list[AgentTrajectory] = []
    for call in calls:
        if not call.extends or not out:
            out.append(AgentTrajectory(prompt_index, sample_index, list(call.prompt_ids), episode=episode))
        else:
            current = out[-1]
            observation = call.prompt_ids[current.context_length:]
            current.response_ids.extend(observation)
            current.response_mask.extend([False] * len(observation))
            current.rollout_logprobs.extend([0.0] * len(observation))
            current.versions.extend([-1] * len(observation))
        current = out[-1]
        current.response_ids.extend(call.response_ids)
        current.response_mask.extend([True] * len(call.response_ids))
        current.rollout_logprobs.extend(float(lp) for lp in call.logprobs)
        current.versions.extend([call.version] * len(call.response_ids))
        current.turns += 1
        current.calls += 1
        current.finish_reason, current.response_text = call.finish_reason, call.text
    return out
