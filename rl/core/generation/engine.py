"""The generation-engine interface: sampling parameters in, rollouts out, weights pushed in after each training step.

Every trainer talks to an engine only through `GenerationEngine`, and picks the implementation by name from
`GENERATION_ENGINES` (via `build_engine`), so the training loop never branches on how tokens are produced.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from rl.core.images import ImageInputs
from rl.core.registry import Registry

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample responses.

    Attributes:
        n: samples drawn per prompt (a GRPO group size).
        temperature: logits are divided by it before sampling; 0 means greedy (argmax) decoding.
        top_p: nucleus sampling; keeps the smallest set of most likely tokens whose probability reaches `top_p`
            (applied after temperature and top-k). 1.0 turns it off.
        top_k: keeps only the `top_k` most likely tokens (applied after temperature). -1 or 0 turns it off.
        max_new_tokens: most tokens generated per response; a response cut here finishes with "length".
        seed: seeds the sampler for one `generate` call, so the same seed, weights, prompts and engine settings give
            identical rollouts. None draws from the process-wide random state.
        stop_token_ids: extra token ids that end a response, besides the tokenizer's EOS (e.g. a chat end-of-turn).
        stop: strings that end a response once its decoded text holds one; the response keeps the token that
            completed the string (so the string too) and finishes with "stop".
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        checks = [
            ("n", isinstance(self.n, int) and self.n >= 1, "an integer >= 1"),
            ("temperature", self.temperature >= 0, ">= 0 (0 means greedy)"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1] (1 turns it off)"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= -1, "an integer >= -1 (-1 or 0 turn it off)"),
            ("max_new_tokens", isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1, "an integer >= 1"),
            ("seed", self.seed is None or isinstance(self.seed, int), "an integer or None"),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "a sequence of non-empty strings"),
        ]
        for key, ok, expected in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{key} must be {expected}, got {getattr(self, key)!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        """True when temperature is 0: argmax decoding, where top_k, top_p and seed play no part."""
        return self.temperature == 0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    def for_part(self, index: int) -> SamplingParams:
        """These params for part `index` of a seeded call (a prompt, an engine's share of the prompts), with a seed of
        its own drawn from (seed, index): parts seeded alike would sample with the same random numbers, their
        samples correlated. An unseeded call stays unseeded."""
        if self.seed is None:
            return self
        digest = hashlib.blake2b(f"{self.seed}/{index}".encode(), digest_size=7).digest()
        return replace(self, seed=int.from_bytes(digest, "big"))


@dataclass
class Rollout:
    """One sampled response to one prompt.

    Attributes:
        prompt_index: index of the prompt in the list given to `generate`.
        sample_index: which of the `n` samples of that prompt this is (0 .. n-1).
        prompt_ids: the prompt's token ids, unpadded.
        response_ids: generated token ids, ending at and including the stop token when one was produced; nothing
            after it, no padding.
        rollout_logprobs: per response token, its log-probability under the distribution it was actually sampled
            from: log_softmax of the logits after temperature, top-k and top-p (tokens masked out get -inf, so the
            distribution is renormalised over the kept ones), as vLLM and veRL report. Under greedy decoding
            (temperature 0) the sampling distribution is taken to be the untempered one, so this equals
            `raw_logprobs`.
        raw_logprobs: per response token, log_softmax of the untempered, unmasked logits (temperature 1), i.e. what a
            teacher-forced forward pass of the same weights gives; None from an engine that reports one kind only
            (vllm reports `rollout_logprobs`).
        finish_reason: "stop" when a stop token ended the response, "length" when `max_new_tokens` did.
        response_text: `response_ids` decoded with special tokens skipped.
        token_versions: per response token, the policy version of the weights that sampled it, where a response
            was generated in segments between which new weights could land (`segments`); None otherwise (the call's
            version holds for every token).
        images: the prompt's images (the `ImageInputs` given to `generate`, not a copy), for a vision-language
            model's training sequences; None for a prompt without images.
    """

    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    raw_logprobs: list[float] | None
    finish_reason: FinishReason
    response_text: str = ""
    token_versions: list[int] | None = None
    images: ImageInputs | None = None


class GenerationEngine(abc.ABC):
    """Produces rollouts from token-id prompts and takes fresh weights after every training step."""

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: Sequence[ImageInputs | None] | None = None) -> list[Rollout]:
        """`params.n` rollouts per prompt, ordered prompt-major: all samples of prompt 0, then of prompt 1, ...
        `images[i]`: prompt i's images for a vision-language model (its placeholder tokens are in the prompt), given
        once per prompt whatever `n`; None for a prompt without images."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors into the model by Hugging Face parameter name; names the model lacks are an error."""

    def device_keys(self) -> list[str]:
        """Where the processes holding the engine's weights sit (`shared_weights.device_key`), one per process in
        the engine's worker-rank order."""
        from rl.core.generation.shared_weights import device_key, engine_worker_slot

        return [device_key(self.device, engine_worker_slot(0))]

    def load_shared(self, handles: dict[str, Any], entries: list) -> None:
        """One bucket shared by handle (`shared_weights`), taken from the device this engine is on."""
        from rl.core.generation.shared_weights import load_shared

        self.update_weights(load_shared(handles, entries, self.device_keys()[0]))

    @abc.abstractmethod
    def offload(self) -> None:
        """Release accelerator memory between generation phases; `generate` is refused until `reload`."""

    @abc.abstractmethod
    def reload(self) -> None:
        """Undo `offload` so `generate` can run again."""


def prompt_images(prompts: list[list[int]], images: Sequence[ImageInputs | None] | None, takes_images: bool,
                  model: str) -> list[ImageInputs | None] | None:
    """A `generate` call's images, one entry (or None) per prompt, or None for a call without any; refused when
    given to a text-only `model` or not one per prompt."""
    if images is None or not any(entry is not None for entry in images):
        return None
    if not takes_images:
        raise ValueError(f"images were given, but {model} is a text-only model")
    if len(images) != len(prompts):
        raise ValueError(f"images has {len(images)} entries for {len(prompts)} prompts; give one (or None) each")
    return list(images)


GENERATION_ENGINES: Registry[type[GenerationEngine]] = Registry("generation engine")


def build_engine(name: str, model_path_or_model: Any, tokenizer: Any, **kwargs: Any) -> GenerationEngine:
    """The engine registered as `name` (e.g. "hf"), built over a model (or its path) and a tokenizer."""
    return GENERATION_ENGINES.get(name)(model_path_or_model, tokenizer, **kwargs)
