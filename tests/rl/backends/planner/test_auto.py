"""The decision guide and the choice of `trainer.strategy=auto` on typed configs (config.json values typed in, no
weights): the guide's rule, then the cheapest layout predicted to fit."""

from __future__ import annotations

import pytest

import rl.backends.registry  # noqa: F401  (registers the strategies a config needs)
from rl.backends.planner import choose, guide, inputs_from_config, resolve_tree, shape_from_config
from rl.backends.planner.terms import GIB
from rl.core.config import config_from_dict, config_to_dict, load_config
from tests.testing.model_configs import LLAMA2_70B, MIXTRAL_8X7B, QWEN25_05B, QWEN25_7B, write_config_dir

QWEN25_14B = {"model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48,
              "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 152064,
              "tie_word_embeddings": False}
# Qwen2-VL-72B's shape as transformers 5 writes it (the language model under text_config): above 30B, but megatron
# takes no vision-language model
QWEN2_VL_72B = {"model_type": "qwen2_vl", "vision_config": {"depth": 32, "embed_dim": 1280},
                "text_config": {"model_type": "qwen2_vl_text", "hidden_size": 8192, "intermediate_size": 29568,
                                "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                                "vocab_size": 152064, "tie_word_embeddings": False}}
EMBEDDED = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 32, "tie_word_embeddings": True}


@pytest.mark.parametrize("config,strategies,rule", [
    (EMBEDDED, ("fsdp2",), "< 14B -> fsdp2"),
    (QWEN25_05B, ("fsdp2",), "< 14B -> fsdp2"),
    (QWEN25_7B, ("fsdp2",), "< 14B -> fsdp2"),
    (QWEN25_14B, ("fsdp2", "megatron"), "14B-30B"),
    (MIXTRAL_8X7B, ("megatron",), "mixture of experts (8 experts) -> megatron"),
    (LLAMA2_70B, ("megatron",), "> 30B -> megatron"),
    (QWEN2_VL_72B, ("fsdp2",), "a vision-language model (72.71B parameters in its language half) -> fsdp2"),
])
def test_guide(config, strategies, rule):
    chosen, why = guide(shape_from_config(config))
    assert chosen == strategies and rule in why


def _cfg(tmp_path, config, *overrides):
    path = write_config_dir(str(tmp_path / "model"), config)
    return load_config([f"trainer.policy.model.path={path}", *overrides])


def test_choose_cheapest_fitting_layout(tmp_path):
    """Qwen2.5-7B, full fine-tuning: on 8 GPUs of 80 GiB plain fsdp2 fits; on one of 24 GiB only offloading the
    policy and the reference does, so that is the choice, with its predicted peak under 24 GiB."""
    cfg = _cfg(tmp_path, QWEN25_7B, "trainer.placement.policy_num_gpus_per_node=8")
    roomy = choose(cfg, inputs_from_config(cfg, shape_from_config(QWEN25_7B), 80 * GIB))
    assert roomy.layout.strategy == "fsdp2" and dict(roomy.layout.settings) == {}
    assert roomy.estimate.peak < 80 * GIB
    cfg = _cfg(tmp_path, QWEN25_7B)
    tight = choose(cfg, inputs_from_config(cfg, shape_from_config(QWEN25_7B), 24 * GIB))
    assert tight.layout.strategy == "fsdp2"
    assert tight.layout.settings == {"trainer.policy.fsdp_config.cpu_offload": True,
                                     "trainer.ref.fsdp_config.cpu_offload": True}
    assert tight.estimate.peak < 24 * GIB and "< 14B -> fsdp2" in tight.reason


def test_resolve_tree_sets_layout_and_record(tmp_path):
    """resolve_tree on a layered tree: the strategy, the layout's keys and trainer.auto_choice; a 70B model on 64
    GPUs of 80 GiB goes to megatron with a model-parallel layout that is predicted to fit."""
    cfg = _cfg(tmp_path, LLAMA2_70B, "trainer.placement.policy_num_nodes=8",
               "trainer.placement.policy_num_gpus_per_node=8", "trainer.placement.colocate_all=false",
               "trainer.policy_mini_batch_size=64", "trainer.train_batch_size=64")
    tree = config_to_dict(cfg)
    tree["trainer"]["strategy"] = "auto"

    def inputs_of(built):
        return inputs_from_config(built, shape_from_config(LLAMA2_70B), 80 * GIB)

    settings, choice = resolve_tree(tree, lambda data: config_from_dict(data, validate=False), inputs_of)
    assert settings["trainer.strategy"] == "megatron" and "> 30B -> megatron" in settings["trainer.auto_choice"]
    key = "trainer.policy.megatron_config.tensor_model_parallel_size"
    assert settings[key] * settings["trainer.policy.megatron_config.pipeline_model_parallel_size"] > 1
    assert choice.estimate.fits(80 * GIB)


def test_unknown_gpu_memory_keeps_the_layout(tmp_path):
    cfg = _cfg(tmp_path, QWEN25_05B)
    choice = choose(cfg, inputs_from_config(cfg, shape_from_config(QWEN25_05B), None))
    assert choice.layout.strategy == "fsdp2" and not choice.layout.settings
    assert "trainer.placement.gpu_memory_gb" in choice.reason


def test_a_vision_language_model_never_gets_megatron():
    from rl.backends.planner.candidates import plan

    cfg = load_config(["trainer.placement.policy_num_gpus_per_node=8"])
    inputs = inputs_from_config(cfg, shape_from_config(QWEN2_VL_72B), 80 * GIB)
    megatron = [e for c, e in plan(cfg, inputs) if e.layout.strategy == "megatron"]
    assert megatron and all(e.excluded == "megatron takes no vision-language model (its conversion has no vision "
                                           "tower)" for e in megatron)
    assert choose(cfg, inputs).layout.strategy != "megatron"
