"""Parameter counts of rl.backends.planner.shape against the published totals of real models (their config.json values
typed in) and against numel() of models transformers builds from small configs."""

from __future__ import annotations

import pytest
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from rl.backends.planner.shape import ShapeError, shape_from_config
from tests.testing.model_configs import PUBLISHED_TOTALS, QWEN25_05B, QWEN25_7B


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTALS))
def test_published_totals(name):
    config, total = PUBLISHED_TOTALS[name]
    assert shape_from_config(config).total_params() == total


def test_qwen25_7b_by_hand():
    """Embedding and untied head 152064 * 3584 each; a layer: q 3584^2 + 3584, k and v 3584*512 + 512, o 3584^2,
    MLP 3 * 3584 * 18944, norms 2 * 3584."""
    shape = shape_from_config(QWEN25_7B)
    layer = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    assert shape.layer_params(False) == layer == 233_057_792
    assert shape.root_params() == 2 * 152064 * 3584 + 3584
    assert (shape.heads, shape.kv_heads, shape.head_dim, shape.tied, shape.qkv_bias) == (28, 4, 128, False, True)


BUILT = [
    (Qwen2ForCausalLM, Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    (LlamaForCausalLM, LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                                   mlp_bias=True)),
    (Qwen3ForCausalLM, Qwen3Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   tie_word_embeddings=True)),
    (MixtralForCausalLM, MixtralConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_local_experts=4,
                                       num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2)),
    (Qwen2MoeForCausalLM, Qwen2MoeConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                         moe_intermediate_size=16, shared_expert_intermediate_size=48, num_experts=4,
                                         num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4,
                                         num_key_value_heads=2, decoder_sparse_step=2, mlp_only_layers=[3])),
]


@pytest.mark.parametrize("cls,config", BUILT, ids=[cls.__name__ for cls, _ in BUILT])
def test_counts_match_built_models(cls, config):
    model = cls(config)
    shape = shape_from_config(config.to_dict())
    assert shape.total_params() == sum(p.numel() for p in model.parameters())
    layers = model.model.layers
    assert shape.largest_layer_params() == max(sum(p.numel() for p in layer.parameters()) for layer in layers)


def test_moe_layers_counted():
    shape = shape_from_config(BUILT[4][1].to_dict())
    assert (shape.experts, shape.moe_layers, shape.shared_intermediate) == (4, 1, 48)  # only layer 1 (step 2, not 3)


def test_lora_params_match_peft(tmp_path):
    from rl.backends.lora import add_lora

    cls, config = BUILT[0]
    model = cls(config)
    model.save_pretrained(tmp_path)
    for targets in (["all-linear"], ["q_proj", "v_proj"]):
        built = cls(config)
        add_lora(built, dict(rank=4, alpha=8, dropout=0.0, target_modules=targets, exclude_modules=None,
                             init_method="kaiming", merge_on_export=False), str(tmp_path))
        trainable = sum(p.numel() for p in built.parameters() if p.requires_grad)
        assert shape_from_config(config.to_dict()).lora_params(4, tuple(targets)) == trainable


def test_missing_key_named():
    with pytest.raises(ShapeError, match="hidden_size"):
        shape_from_config({"num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10}, "m/config.json")


def test_defaults_of_a_config_without_optional_keys():
    shape = shape_from_config({k: v for k, v in QWEN25_05B.items() if k != "num_key_value_heads"})
    assert shape.kv_heads == shape.heads == 14 and shape.head_dim == 64
