"""The "hf" generation engine: batched sampling with a Hugging Face causal LM's `generate`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedModel

from rl.core.batch_invariant import make_batch_invariant
from rl.core.generation.engine import GENERATION_ENGINES, GenerationEngine, Rollout, SamplingParams, prompt_images
from rl.core.generation.sampling import recording_processors
from rl.core.generation.sequences import cut_at_stop, cut_at_stop_string, left_pad
from rl.core.generation.weights import copy_named_tensors
from rl.core.images import ImageInputs
from rl.core.model_class import is_vision_language, load_generative, vision_token_ids


@contextlib.contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed the random state (host and every device of `device`'s type) for the block, and restore all of it
    afterwards; with seed None, leave it alone."""
    if seed is None:
        yield
        return
    on_accelerator = device.type not in ("cpu", "meta")
    device_type = device.type if on_accelerator else None
    count = torch.get_device_module(device.type).device_count() if on_accelerator else 0
    with torch.random.fork_rng(devices=range(count), device_type=device_type):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def generation_mode(model: PreTrainedModel) -> Iterator[None]:
    """Eval mode, no autograd, and a blank `model.generation_config` so defaults from the checkpoint's
    generation_config.json (repetition penalty, top-k, ...) cannot alter what `SamplingParams` asks for."""
    was_training, saved_config = model.training, model.generation_config
    model.eval()
    model.generation_config = GenerationConfig()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.generation_config = saved_config
        model.train(was_training)


def _load(model: Any, tokenizer: Any, dtype: torch.dtype | None) -> tuple[PreTrainedModel, Any]:
    if isinstance(model, str | os.PathLike):
        model = load_generative(model, dtype=dtype or "auto")
    if isinstance(tokenizer, str | os.PathLike):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a Hugging Face causal LM or a path to one, got {type(model).__name__}")
    return model, tokenizer


@GENERATION_ENGINES.register("hf")
class HFGenerationEngine(GenerationEngine):
    """Generation with `model.generate`, `max_batch_size` sequences at a time.

    Prompts are repeated `n` times (prompt-major), left-padded with explicit attention mask and position ids, and
    decoded until a stop token (the tokenizer's EOS plus `SamplingParams.stop_token_ids`), a stop string (`stop`) or
    `max_new_tokens`. A vision-language model (Qwen2-VL's family) takes each prompt's images with it: its pixel
    values are repeated for the prompt's samples inside the engine, and the model places its multimodal rotary
    positions from the image placeholders itself.
    Seeding: with `SamplingParams.seed` set, the call runs under a private copy of the global random state seeded
    with it, so rollouts depend only on the seed, the other sampling params, the weights, the prompts and
    `max_batch_size` (which sets how random draws are batched).

    Args:
        model: a `PreTrainedModel` (used in place, not copied) or a path to load one from (a causal LM, or an
            image-text-to-text model).
        tokenizer: a tokenizer (for EOS/pad ids and decoding) or a path for `AutoTokenizer.from_pretrained`.
        max_batch_size: most sequences (prompts x samples) per `generate` call; bounds memory.
        device: where to run; defaults to where the model's parameters already are.
        dtype: dtype when loading from a path ("auto" when None).
        exact: batch-invariant arithmetic (`rl.core.batch_invariant`, `trainer.exact_on_policy`): a token's logits
            and logprobs do not depend on the rest of the batch, its padding or the KV cache, and equal those of the
            trainer's forward under the same weights, bit for bit.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        exact: bool = False,
    ):
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
        self.model, self.tokenizer = _load(model, tokenizer, dtype)
        self.max_batch_size = max_batch_size
        self.device = torch.device(device) if device is not None else next(self.model.parameters()).device
        self.model.to(self.device)
        self.eos_token_id: int | None = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.pad_token_id: int = pad if pad is not None else (self.eos_token_id or 0)
        self.vocab_size: int = self.model.get_input_embeddings().num_embeddings
        self.takes_images = is_vision_language(self.model.config)
        self.never_sampled = vision_token_ids(self.model.config)  # only the processor writes them
        self.offloaded = False
        self.exact = exact
        if exact:
            if self.takes_images:
                raise ValueError("exact on-policy generation does not cover a vision-language model's vision tower")
            make_batch_invariant(self.model)

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: Sequence[ImageInputs | None] | None = None) -> list[Rollout]:
        if self.offloaded:
            raise RuntimeError("the generation engine is offloaded; call reload() before generate()")
        self._check_prompts(prompts)
        images = prompt_images(prompts, images, self.takes_images, type(self.model).__name__)
        jobs = [(p, s) for p in range(len(prompts)) for s in range(params.n)]
        stop_ids = self._stop_ids(params)
        config = self._generation_config(params, stop_ids)
        rollouts: list[Rollout] = []
        with seeded(params.seed, self.device), generation_mode(self.model):
            for start in range(0, len(jobs), self.max_batch_size):
                chunk = jobs[start : start + self.max_batch_size]
                rollouts.extend(self._generate_chunk(prompts, chunk, params, config, stop_ids, images))
        return rollouts

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        chunk: Sequence[tuple[int, int]],
        params: SamplingParams,
        config: GenerationConfig,
        stop_ids: frozenset[int],
        images: Sequence[ImageInputs | None] | None,
    ) -> list[Rollout]:
        inputs = self._model_inputs([prompts[p] for p, _ in chunk], [images[p] for p, _ in chunk] if images else [])
        input_ids = inputs["input_ids"]
        processors, raw, processed = recording_processors(params, self.never_sampled, self.exact)
        sequences = self.model.generate(
            **inputs,
            generation_config=config,
            logits_processor=processors,
            tokenizer=self.tokenizer if params.stop else None,  # for generate's early stop at stop strings
        )
        new_tokens = sequences[:, input_ids.shape[1] :]
        raw_lp, processed_lp = raw.finish(new_tokens).tolist(), processed.finish(new_tokens).tolist()
        tokens = new_tokens.tolist()
        cuts = [self._cut(row, stop_ids, params.stop) for row in tokens]
        responses = [row[:length] for row, (length, _) in zip(tokens, cuts, strict=True)]
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return [
            Rollout(
                prompt_index=p,
                sample_index=s,
                prompt_ids=list(prompts[p]),
                response_ids=responses[i],
                rollout_logprobs=processed_lp[i][: cuts[i][0]],
                raw_logprobs=raw_lp[i][: cuts[i][0]],
                finish_reason=cuts[i][1],
                response_text=texts[i],
                images=images[p] if images else None,
            )
            for i, (p, s) in enumerate(chunk)
        ]

    def _model_inputs(self, rows: list[list[int]], images: list[ImageInputs | None]) -> dict[str, torch.Tensor]:
        """The left-padded rows; for a vision-language model the placeholders' types in place of position ids
        (it derives its multimodal positions from them) and the rows' images in row order."""
        input_ids, attention_mask, position_ids = left_pad(rows, self.pad_token_id, self.device)
        if not self.takes_images:
            return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask,
                  "mm_token_type_ids": (input_ids == self.model.config.image_token_id).long()}
        given = [entry for entry in images if entry is not None]
        if given:
            dtype = next(self.model.parameters()).dtype
            inputs["pixel_values"] = torch.cat([entry.pixel_values for entry in given]).to(self.device, dtype)
            inputs["image_grid_thw"] = torch.cat([entry.grid_thw for entry in given]).to(self.device)
        return inputs

    def _cut(self, row: list[int], stop_ids: frozenset[int], stops: tuple[str, ...]) -> tuple[int, str]:
        """How many tokens of `row` form the response and why it ended: at the first stop token, or earlier at the
        token completing a stop string (the text decoded as `response_text` is)."""
        length, reason = cut_at_stop(row, stop_ids)
        at_string = cut_at_stop_string(row[:length], lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
                                       stops)
        return (at_string, "stop") if at_string is not None else (length, reason)

    def _stop_ids(self, params: SamplingParams) -> frozenset[int]:
        eos = () if self.eos_token_id is None else (self.eos_token_id,)
        return frozenset((*eos, *params.stop_token_ids))

    def _generation_config(self, params: SamplingParams, stop_ids: frozenset[int]) -> GenerationConfig:
        """Sampling itself is shaped by our own processors, so the config asks `generate` for none of its own.
        Stop strings only let `generate` finish a row early; `_cut` decides where each response ends."""
        neutral = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if not params.greedy else {}
        return GenerationConfig(
            do_sample=not params.greedy,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=sorted(stop_ids) or None,
            stop_strings=list(params.stop) or None,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            **neutral,
        )

    def _check_prompts(self, prompts: list[list[int]]) -> None:
        for index, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise ValueError(f"prompts[{index}] is empty; every prompt needs at least one token")
            low, high = min(prompt), max(prompt)
            if low < 0 or high >= self.vocab_size:
                bad = low if low < 0 else high
                raise ValueError(
                    f"prompts[{index}] holds token id {bad}, outside the model's vocab [0, {self.vocab_size})"
                )

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors in by HF name (see `copy_named_tensors`); works while offloaded too."""
        copy_named_tensors(self.model, named_tensors)

    def offload(self) -> None:
        """Move the model to host memory and free the accelerator cache. On CPU the weights stay put; either way
        `generate` is refused until `reload`, so a missed `reload` shows up in CPU runs as well."""
        if self.device.type != "cpu":
            self.model.to("cpu")
            device_module = getattr(torch, self.device.type, None)
            if device_module is not None and hasattr(device_module, "empty_cache"):
                device_module.empty_cache()
        self.offloaded = True

    def reload(self) -> None:
        """Bring the model back to its device (a no-op move on CPU)."""
        if self.device.type != "cpu":
            self.model.to(self.device)
        self.offloaded = False
