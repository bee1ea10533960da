"""Logits processing for sampling, and per-token log-probabilities recorded while `generate` runs.

Order follows vLLM: temperature, then top-k, then top-p (on the top-k-renormalised distribution). Recording is done by
identity processors that keep one step of log-probabilities and pick out the chosen token's entry on the next step,
so memory stays at one [batch, vocab] slice however long the responses get (instead of the [steps, batch, vocab]
tensors `output_scores` / `output_logits` would hold).
"""

from __future__ import annotations

import torch
from transformers.generation import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rl.core import batch_invariant
from rl.core.generation.engine import SamplingParams


class LogprobRecorder(LogitsProcessor):
    """Identity processor recording the log-probability of each chosen token under the scores it is given.

    At step t it sees the scores of step t and, in `input_ids`, the token chosen at step t-1; so it stores step t's
    log_softmax and resolves step t-1's entry. `finish` resolves the last step from the final sequences.
    """

    def __init__(self, exact: bool = False) -> None:
        self._pending: torch.Tensor | None = None
        self._steps: list[torch.Tensor] = []
        self.exact = exact  # the batch-invariant log-softmax (`rl.core.batch_invariant`), the trainer's in that mode

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._resolve(input_ids[:, -1])
        scores32 = scores.float()
        self._pending = batch_invariant.log_softmax(scores32) if self.exact else torch.log_softmax(scores32, dim=-1)
        return scores

    def _resolve(self, chosen: torch.Tensor) -> None:
        if self._pending is not None:
            self._steps.append(self._pending.gather(-1, chosen[:, None]).squeeze(-1))
            self._pending = None

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """[batch, steps] log-probabilities of `new_tokens` ([batch, steps], the generated part of the sequences)."""
        steps = new_tokens.shape[1]
        if len(self._steps) < steps:
            self._resolve(new_tokens[:, len(self._steps)])
        self._pending = None
        if len(self._steps) < steps:
            raise RuntimeError(f"recorded {len(self._steps)} decoding steps but {steps} tokens were generated")
        if steps == 0:
            return new_tokens.new_zeros(new_tokens.shape, dtype=torch.float32)
        return torch.stack(self._steps[:steps], dim=1)


def sampling_warpers(params: SamplingParams) -> list[LogitsProcessor]:
    """The processors turning raw logits into the distribution tokens are drawn from (none for greedy)."""
    if params.greedy:
        return []
    warpers: list[LogitsProcessor] = []
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k_enabled:
        warpers.append(TopKLogitsWarper(top_k=params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=params.top_p))
    return warpers


class NeverSample(LogitsProcessor):
    """Tokens that are never sampled (their scores -inf): a vision-language model's image placeholders and
    markers, which only the processor writes and which would ask the model for an image that does not exist."""

    def __init__(self, token_ids: tuple[int, ...]):
        self.token_ids = list(token_ids)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores[:, self.token_ids] = float("-inf")
        return scores


def recording_processors(params: SamplingParams, never: tuple[int, ...] = (), exact: bool = False
                         ) -> tuple[LogitsProcessorList, LogprobRecorder, LogprobRecorder]:
    """(processors for `generate`, raw recorder, sampling recorder).

    The raw recorder sees the untempered logits; the sampling recorder sees them after `never`'s mask and the
    warpers, as a mask of top-k's does. When neither applies (greedy decoding, whose argmax is taken over the
    untempered logits, or plain temperature-1 sampling) both are the same recorder. `exact`: both take the
    batch-invariant log-softmax.
    """
    raw = LogprobRecorder(exact)
    shaping = [*([NeverSample(never)] if never else []), *sampling_warpers(params)]
    if not shaping:
        return LogitsProcessorList([raw]), raw, raw
    processed = LogprobRecorder(exact)
    return LogitsProcessorList([raw, *shaping, processed]), raw, processed
