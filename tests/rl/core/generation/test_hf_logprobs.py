"""Rollout log-probabilities against a teacher-forced forward pass of the same model over prompt + response."""

from __future__ import annotations

import pytest
import torch

from rl.core.generation import SamplingParams
from tests.testing import tolerances


def teacher_forced_logits(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """[len(response), vocab]: the logits that predicted each response token, from one unpadded forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]


def sampling_log_softmax(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, then top-k, then top-p (smallest set of likeliest tokens whose mass reaches top_p)."""
    scores = logits / temperature
    if top_k > 0:
        kth_largest = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth_largest, float("-inf"))
    if top_p < 1.0:
        probs, order = scores.softmax(-1).sort(dim=-1, descending=True)
        mass_before = probs.cumsum(-1) - probs
        drop = torch.zeros_like(mass_before, dtype=torch.bool).scatter(-1, order, mass_before >= top_p)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.log_softmax(-1)


def chosen(log_probs: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    return log_probs.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.3, 5, 1.0), (0.8, 0, 0.9), (1.0, 8, 0.7), (0.6, 3, 0.95)],
)
def test_logprobs_match_teacher_forcing(make_engine, prompts, temperature, top_k, top_p):
    engine = make_engine(seed=0, max_batch_size=4)
    params = SamplingParams(n=3, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=10, seed=7)
    rollouts = engine.generate(prompts, params)
    assert len(rollouts) == len(prompts) * 3
    for rollout in rollouts:
        logits = teacher_forced_logits(engine.model, rollout.prompt_ids, rollout.response_ids)
        raw = chosen(logits.log_softmax(-1), rollout.response_ids)
        processed = chosen(sampling_log_softmax(logits, temperature, top_k, top_p), rollout.response_ids)
        assert len(rollout.raw_logprobs) == len(rollout.rollout_logprobs) == len(rollout.response_ids)
        scaled = logits * max(1.0, 1.0 / temperature)  # raw logprobs read the logits, processed ones logits / T
        length = len(rollout.prompt_ids) + len(rollout.response_ids)
        atol = tolerances.logprob_gap(engine.model.config, scaled, length)
        torch.testing.assert_close(torch.tensor(rollout.raw_logprobs), raw, rtol=0, atol=atol)
        torch.testing.assert_close(torch.tensor(rollout.rollout_logprobs), processed, rtol=0, atol=atol)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_greedy_logprobs_are_the_untempered_ones(make_engine, prompts, arch):
    engine = make_engine(seed=0, arch=arch)
    for rollout in engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=10)):
        logits = teacher_forced_logits(engine.model, rollout.prompt_ids, rollout.response_ids)
        raw = chosen(logits.log_softmax(-1), rollout.response_ids)
        length = len(rollout.prompt_ids) + len(rollout.response_ids)
        atol = tolerances.logprob_gap(engine.model.config, logits, length)
        torch.testing.assert_close(torch.tensor(rollout.raw_logprobs), raw, rtol=0, atol=atol)
        assert rollout.rollout_logprobs == rollout.raw_logprobs


def test_top_k_one_puts_all_mass_on_the_sampled_token(make_engine, prompts):
    engine = make_engine(seed=0)
    rollouts = engine.generate(prompts, SamplingParams(n=2, temperature=0.9, top_k=1, max_new_tokens=6, seed=1))
    for rollout in rollouts:
        # top-k 1 leaves one finite logit x in the row: log_softmax gives x - x - log(e^0 + 0 + ...) = 0, each step
        # exact (the max is x itself, e^0 = 1 and log 1 = 0 in any order), so 0 bit for bit
        assert rollout.rollout_logprobs == [0.0] * len(rollout.response_ids)
        assert all(lp < 0 for lp in rollout.raw_logprobs)
