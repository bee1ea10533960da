"""Weight sync into the "hf" engine, and the offload / reload cycle."""

from __future__ import annotations

import pytest
import torch

from rl.core.generation import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)


def test_engine_generates_like_the_model_whose_weights_it_received(
    make_engine, make_model, prompts, tokenizer, greedy_reference
):
    engine, other = make_engine(seed=0), make_model(seed=1)
    stop = {tokenizer.eos_token_id}
    expected = [greedy_reference(other, prompt, GREEDY.max_new_tokens, stop) for prompt in prompts]
    assert [r.response_ids for r in engine.generate(prompts, GREEDY)] != expected
    engine.update_weights(other.state_dict().items())
    assert [r.response_ids for r in engine.generate(prompts, GREEDY)] == expected


def test_weights_in_another_dtype_are_converted(make_engine, make_model):
    engine, other = make_engine(seed=0), make_model(seed=1)
    engine.update_weights((name, tensor.double()) for name, tensor in other.named_parameters())
    for name, tensor in engine.model.named_parameters():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(tensor, dict(other.named_parameters())[name], rtol=0, atol=0)


def test_tied_embeddings_follow_either_name(make_engine, make_model):
    engine = make_engine(seed=0, tied=True)
    model = engine.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    source = make_model(seed=1, tied=True)
    engine.update_weights(source.state_dict().items())  # holds both tied names
    torch.testing.assert_close(model.lm_head.weight, source.lm_head.weight, rtol=0, atol=0)
    fresh = torch.randn_like(model.lm_head.weight)
    engine.update_weights([("model.embed_tokens.weight", fresh)])
    torch.testing.assert_close(model.lm_head.weight, fresh, rtol=0, atol=0)


def test_different_values_for_tied_names_are_refused(make_engine):
    engine = make_engine(seed=0, tied=True)
    weight = engine.model.lm_head.weight
    pairs = [("model.embed_tokens.weight", torch.zeros_like(weight)), ("lm_head.weight", torch.ones_like(weight))]
    with pytest.raises(ValueError, match=r"'lm_head.weight' is tied to 'model.embed_tokens.weight'"):
        engine.update_weights(pairs)


def test_unknown_names_are_listed(make_engine):
    engine = make_engine(seed=0)
    good = engine.model.model.norm.weight
    pairs = [
        ("model.norm.weight", torch.full_like(good, 2.0)),
        ("model.embed_tokenz.weight", torch.zeros(64, 32)),
        ("_fsdp_wrapped_module.lm_head.weight", torch.zeros(64, 32)),
    ]
    with pytest.raises(ValueError, match="2 name") as error:
        engine.update_weights(pairs)
    message = str(error.value)
    assert "'model.embed_tokenz.weight'" in message and "'_fsdp_wrapped_module.lm_head.weight'" in message
    assert "did you mean 'model.embed_tokens.weight'" in message


def test_shape_mismatch_names_the_parameter(make_engine):
    engine = make_engine(seed=0)
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(31,\), the model's is \(32,\)"):
        engine.update_weights([("model.norm.weight", torch.ones(31))])


def test_offload_refuses_generate_until_reload(make_engine, prompts):
    engine = make_engine(seed=0)
    before = engine.generate(prompts, GREEDY)
    engine.offload()
    with pytest.raises(RuntimeError, match=r"reload\(\)"):
        engine.generate(prompts, GREEDY)
    engine.reload()
    assert [r.response_ids for r in engine.generate(prompts, GREEDY)] == [r.response_ids for r in before]
