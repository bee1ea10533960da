"""Token layout helpers: left-padded prompt batches and responses cut at their stop token."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch

from rl.core.generation.engine import FinishReason


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack prompts right-aligned: (input_ids, attention_mask, position_ids), each [batch, longest prompt].

    Padding sits on the left with attention_mask 0; position ids count real tokens only, so every prompt starts at
    position 0 whatever its padding (padded slots get position 0 and are masked anyway).
    """
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            input_ids[row, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)


def cut_at_stop_string(tokens: Sequence[int], decode: Callable[[Sequence[int]], str],
                       stops: Sequence[str]) -> int | None:
    """The length of the shortest prefix of `tokens` whose decoded text holds one of `stops` (so it ends with the
    token that completed the string), or None when the whole text holds none. A binary search over prefix lengths:
    a prefix holding a stop string stays holding it as tokens are added."""
    holds = lambda length: any(stop in decode(tokens[:length]) for stop in stops)  # noqa: E731
    if not stops or not holds(len(tokens)):
        return None
    low, high = 1, len(tokens)
    while low < high:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle + 1
    return low


def cut_at_stop(tokens: Sequence[int], stop_ids: Collection[int]) -> tuple[int, FinishReason]:
    """How many leading tokens form the response, and why it ended.

    The response runs up to and including the first stop token ("stop"); with none, it is all of `tokens`
    ("length").
    """
    for position, token in enumerate(tokens):
        if token in stop_ids:
            return position + 1, "stop"
    return len(tokens), "length"
