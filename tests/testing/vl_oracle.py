"""The oracle for an engine's rollouts from a vision-language model: a transformers forward of (images, prompt +
response) with the vision tokens masked out, as the engines sample (the sampling distribution renormalises over the
other tokens), within the float32 bound of the decoder's and the vision tower's reductions."""

from __future__ import annotations

import torch

from rl.core.model_class import vision_token_ids
from tests.testing.tolerances import assert_within, decoder_reductions, network_rtol, vision_tower_reductions


def sampled_logprobs(model, rollout, temperature: float) -> tuple[torch.Tensor, float]:
    """(the response tokens' logprobs under the model's masked, tempered distribution, the bound on their gap to an
    engine's: both sides compute the same network in other orders, relative to the logits)."""
    ids = torch.tensor([rollout.prompt_ids + rollout.response_ids])
    inputs = {"input_ids": ids, "mm_token_type_ids": (ids == model.config.image_token_id).long()}
    patches = 0
    if rollout.images is not None:
        inputs.update(pixel_values=rollout.images.pixel_values, image_grid_thw=rollout.images.grid_thw)
        patches = int(rollout.images.grid_thw.prod(-1).max())
    with torch.no_grad():
        logits = model(**inputs).logits[0, len(rollout.prompt_ids) - 1:-1].float() / temperature
    logits[:, list(vision_token_ids(model.config))] = float("-inf")
    config = model.config
    reductions = decoder_reductions(config.text_config, ids.shape[1]) + (
        vision_tower_reductions(config.vision_config, patches) if patches else [])
    gap = network_rtol(reductions, torch.float32) * float(logits[logits.isfinite()].abs().max())
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(rollout.response_ids)[:, None])[:, 0], gap


def assert_sampled_as_the_model(model, rollouts, temperature: float) -> None:
    """Every rollout's sampling logprobs equal the oracle's; at least one response is non-empty; no vision token is
    ever sampled."""
    never = set(vision_token_ids(model.config))
    checked = 0
    for rollout in rollouts:
        assert not never & set(rollout.response_ids), "a vision token was sampled"
        if rollout.response_ids:
            want, gap = sampled_logprobs(model, rollout, temperature)
            assert_within(torch.tensor(rollout.rollout_logprobs), want, gap, "rollout logprobs")
            checked += 1
    assert checked
