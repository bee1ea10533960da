"""SamplingParams validation and choosing an engine by name."""

from __future__ import annotations

import pytest

from rl.core.generation import GENERATION_ENGINES, GenerationEngine, HFGenerationEngine, SamplingParams, build_engine


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 0), ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("max_new_tokens", 0)],
)
def test_bad_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be"):
        SamplingParams(**{field: value})


def test_greedy_is_temperature_zero():
    assert SamplingParams(temperature=0).greedy
    assert not SamplingParams(temperature=0.5).greedy
    assert not SamplingParams(top_k=-1).top_k_enabled and not SamplingParams(top_k=0).top_k_enabled
    assert SamplingParams(top_k=4).top_k_enabled


def test_build_engine_by_name(tokenizer, make_model):
    engine = build_engine("hf", make_model(seed=0), tokenizer, max_batch_size=3)
    assert isinstance(engine, HFGenerationEngine) and isinstance(engine, GenerationEngine)
    assert engine.max_batch_size == 3
    assert "hf" in GENERATION_ENGINES.names()


def test_unknown_engine_lists_the_choices(tokenizer, make_model):
    with pytest.raises(KeyError, match=r"unknown generation engine 'hff'.*hf.*Did you mean 'hf'"):
        build_engine("hff", make_model(seed=0), tokenizer)


def test_bad_batch_size_is_refused(tokenizer, make_model):
    with pytest.raises(ValueError, match="max_batch_size must be"):
        build_engine("hf", make_model(seed=0), tokenizer, max_batch_size=0)


def test_engine_loads_from_a_saved_path(tmp_path, tokenizer, make_model):
    model = make_model(seed=4)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = build_engine("hf", str(tmp_path), str(tmp_path))
    (rollout,) = engine.generate([[5, 6, 7]], SamplingParams(temperature=0, max_new_tokens=5))
    (expected,) = HFGenerationEngine(model, tokenizer).generate(
        [[5, 6, 7]], SamplingParams(temperature=0, max_new_tokens=5)
    )
    assert rollout.response_ids == expected.response_ids
