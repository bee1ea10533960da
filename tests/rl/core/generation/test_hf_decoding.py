"""Decoding behaviour of the "hf" engine: greedy vs a hand-written argmax loop, left padding, ordering, stopping,
seeding."""

from __future__ import annotations

import pytest
import torch

from rl.core.generation import SamplingParams
from rl.core.generation.sequences import cut_at_stop, left_pad
from tests.testing import tolerances

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_greedy_matches_manual_argmax_loop(make_engine, prompts, tokenizer, greedy_reference, arch):
    engine = make_engine(seed=0, arch=arch)
    rollouts = engine.generate(prompts, GREEDY)
    for rollout, prompt in zip(rollouts, prompts, strict=True):
        expected = greedy_reference(engine.model, prompt, GREEDY.max_new_tokens, {tokenizer.eos_token_id})
        assert rollout.prompt_ids == prompt
        assert rollout.response_ids == expected


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_left_padded_batch_matches_each_prompt_alone(make_engine, prompts, arch):
    engine = make_engine(seed=2, arch=arch)
    batched = engine.generate(prompts, GREEDY)
    for index, prompt in enumerate(prompts):
        (alone,) = engine.generate([prompt], GREEDY)
        assert batched[index].response_ids == alone.response_ids
        # the same logits in other orders (a padded batch); bounded relative to their magnitude
        with torch.no_grad():
            logits = engine.model(torch.tensor([prompt + alone.response_ids])).logits
        atol = tolerances.logprob_gap(engine.model.config, logits, logits.shape[1])
        assert batched[index].raw_logprobs == pytest.approx(alone.raw_logprobs, abs=atol)


def test_top_k_one_sampling_equals_greedy(make_engine, prompts):
    engine = make_engine(seed=0)
    greedy = engine.generate(prompts, GREEDY)
    sampled = engine.generate(prompts, SamplingParams(n=2, temperature=0.8, top_k=1, max_new_tokens=12, seed=5))
    for rollout in sampled:
        assert rollout.response_ids == greedy[rollout.prompt_index].response_ids


def test_n_samples_are_prompt_major(make_engine, prompts):
    engine = make_engine(seed=0, max_batch_size=4)
    rollouts = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=4, seed=0))
    assert [(r.prompt_index, r.sample_index) for r in rollouts] == [
        (p, s) for p in range(len(prompts)) for s in range(3)
    ]
    assert all(r.prompt_ids == prompts[r.prompt_index] for r in rollouts)
    assert engine.generate([], SamplingParams(n=3)) == []


def test_stop_at_eos_and_length_cut(make_engine, prompts, tokenizer, vocab):
    engine = make_engine(seed=0, max_batch_size=32)
    eos, limit = tokenizer.eos_token_id, 16
    rollouts = engine.generate(prompts, SamplingParams(n=16, temperature=1.0, max_new_tokens=limit, seed=3))
    for rollout in rollouts:
        body = rollout.response_ids[:-1] if rollout.finish_reason == "stop" else rollout.response_ids
        assert eos not in body
        assert len(rollout.rollout_logprobs) == len(rollout.raw_logprobs) == len(rollout.response_ids)
        assert rollout.response_text == "".join(vocab[t] for t in body if t >= 3)  # ids 0-2 are <pad>, <eos>, <unk>
        if rollout.finish_reason == "stop":
            assert rollout.response_ids[-1] == eos and len(rollout.response_ids) <= limit
        else:
            assert rollout.finish_reason == "length" and len(rollout.response_ids) == limit
    assert {r.finish_reason for r in rollouts} == {"stop", "length"}


def test_extra_stop_token_ids_end_the_response(make_engine, prompts):
    engine = make_engine(seed=0)
    free = engine.generate(prompts, GREEDY)
    stop = free[0].response_ids[3]
    stopped = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(stop,)))
    for before, after in zip(free, stopped, strict=True):
        if stop in before.response_ids:
            end = before.response_ids.index(stop) + 1
            assert after.response_ids == before.response_ids[:end] and after.finish_reason == "stop"
        else:
            assert after.response_ids == before.response_ids
    assert stopped[0].response_ids[-1] == stop


def _signature(rollouts):
    return [(r.response_ids, r.rollout_logprobs) for r in rollouts]


def test_same_seed_same_rollouts_different_seed_different(make_engine, prompts):
    engine = make_engine(seed=0, max_batch_size=8)
    params = SamplingParams(n=2, temperature=1.0, top_p=0.95, max_new_tokens=12, seed=11)
    first = engine.generate(prompts, params)
    torch.rand(5)  # disturbing the global random state must not matter
    assert _signature(engine.generate(prompts, params)) == _signature(first)
    other = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, top_p=0.95, max_new_tokens=12, seed=12))
    assert [r.response_ids for r in other] != [r.response_ids for r in first]


def test_seeded_generation_leaves_global_random_state_alone(make_engine, prompts):
    engine = make_engine(seed=0)
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    engine.generate(prompts, SamplingParams(n=2, max_new_tokens=4, seed=9))
    assert torch.equal(torch.rand(4), expected)


def test_generate_restores_training_mode_and_generation_config(make_engine, prompts):
    engine = make_engine(seed=0)
    engine.model.train()
    config = engine.model.generation_config
    engine.generate(prompts[:2], GREEDY)
    assert engine.model.training and engine.model.generation_config is config


def test_bad_prompts_name_the_index(make_engine):
    engine = make_engine(seed=0)
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        engine.generate([[3, 4], []], GREEDY)
    with pytest.raises(ValueError, match=r"prompts\[0\] holds token id 64"):
        engine.generate([[3, 64]], GREEDY)


def test_left_pad_and_cut_at_stop_by_hand():
    input_ids, mask, positions = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert input_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert cut_at_stop([4, 9, 1, 1, 1], {1}) == (3, "stop")
    assert cut_at_stop([4, 9, 3], {1, 2}) == (3, "length")


def _naive_string_cut(tokens, tokenizer, stops):
    """The first prefix whose text holds a stop string, found by decoding every prefix."""
    for length in range(1, len(tokens) + 1):
        if any(stop in tokenizer.decode(tokens[:length], skip_special_tokens=True) for stop in stops):
            return length
    return None


def test_stop_strings_cut_at_the_token_completing_them(make_engine, prompts, tokenizer):
    engine = make_engine(seed=0, max_batch_size=32)
    stops = ("ab", "7", "q")
    free = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=16, seed=4))
    stopped = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=16, seed=4, stop=stops))
    reasons = set()
    for before, after in zip(free, stopped, strict=True):
        length, _ = cut_at_stop(before.response_ids, {tokenizer.eos_token_id})
        cut = _naive_string_cut(before.response_ids[:length], tokenizer, stops)
        if cut is None:
            assert after.response_ids == before.response_ids and after.finish_reason == before.finish_reason
        else:
            assert after.response_ids == before.response_ids[:cut] and after.finish_reason == "stop"
            assert any(after.response_text.endswith(stop) for stop in stops), after.response_text
            reasons.add("string")
        assert after.rollout_logprobs == before.rollout_logprobs[:len(after.response_ids)]
        reasons.add(after.finish_reason)
    assert reasons >= {"string", "length"}  # both kinds of ending were exercised
