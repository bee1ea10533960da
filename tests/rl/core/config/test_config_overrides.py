"""key=value overrides of every value type, list parsing, path expansion, and layering precedence."""

from __future__ import annotations

import os
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import ConfigError, load_config


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def test_int_float_bool_string_overrides():
    cfg = load_config(
        [
            "trainer.seed=7",
            "trainer.policy.optimizer_config.lr=3e-6",
            "trainer.algorithm.eps_clip_high=0.28",
            "trainer.gradient_checkpointing=true",
            "trainer.use_sample_packing=false",
            "trainer.project_name=my-project",
            "generator.top_k=5",
        ]
    )
    assert cfg.trainer.seed == 7
    assert cfg.trainer.policy.optimizer_config.lr == 3e-6
    assert cfg.trainer.algorithm.eps_clip_high == 0.28
    assert cfg.trainer.gradient_checkpointing is True
    assert cfg.trainer.use_sample_packing is False
    assert cfg.trainer.project_name == "my-project"
    assert cfg.generator.top_k == 5


def test_int_accepted_for_float_field_and_stored_as_float():
    cfg = load_config(["generator.temperature=1", "trainer.algorithm.clip_ratio_c=5"])
    assert cfg.generator.temperature == 1.0 and type(cfg.generator.temperature) is float
    assert cfg.trainer.algorithm.clip_ratio_c == 5.0 and type(cfg.trainer.algorithm.clip_ratio_c) is float


@pytest.mark.parametrize("text", ["1e-6", "1E-6", "1.0e-6", "0.000001", "+1e-6"])
def test_scientific_notation_is_a_float(text):
    assert load_config([f"trainer.policy.optimizer_config.lr={text}"]).trainer.policy.optimizer_config.lr == 1e-6


def test_null_overrides():
    assert load_config(["trainer.max_steps=null"]).trainer.max_steps is None
    assert load_config(["trainer.run_name=abc", "trainer.run_name=null"]).trainer.run_name is None
    assert load_config(["trainer.run_name=~"]).trainer.run_name is None
    recompute = "trainer.policy.megatron_config.recompute_granularity"
    cfg = load_config(["trainer.strategy=megatron", f"{recompute}=selective", f"{recompute}=null"])
    assert cfg.blocks["trainer.policy.megatron_config"].recompute_granularity is None


def test_string_keys_keep_text_as_written():
    cfg = load_config(["trainer.run_name=2024", "trainer.project_name=1.10", "data.reward_fn=true"])
    assert cfg.trainer.run_name == "2024"
    assert cfg.trainer.project_name == "1.10"
    assert cfg.data.reward_fn == ["true"]
    assert load_config(["trainer.run_name='quoted name'"]).trainer.run_name == "quoted name"
    assert load_config(["trainer.run_name=a: b # c"]).trainer.run_name == "a: b # c"


def test_value_may_contain_equals_sign():
    assert load_config(["trainer.run_name=lr=1e-6"]).trainer.run_name == "lr=1e-6"


def test_list_overrides():
    cfg = load_config(
        [
            "data.train_data=['a.parquet','b.parquet']",
            "data.val_data=[]",
            "trainer.policy.optimizer_config.betas=[0.9, 0.95]",
            "trainer.logger=[console, tensorboard]",
        ]
    )
    assert cfg.data.train_data == ["a.parquet", "b.parquet"]
    assert cfg.data.val_data == []
    assert cfg.trainer.policy.optimizer_config.betas == [0.9, 0.95]
    assert cfg.trainer.logger == ["console", "tensorboard"]


def test_single_value_for_a_list_becomes_a_one_item_list():
    cfg = load_config(["trainer.logger=wandb", "data.train_data=train.jsonl", "data.val_data=2024"])
    assert cfg.trainer.logger == ["wandb"]
    assert cfg.data.train_data == ["train.jsonl"]
    assert cfg.data.val_data == ["2024"]


def test_home_is_expanded_in_data_paths():
    home = os.path.expanduser("~")
    cfg = load_config(["data.train_data=['~/d/train.parquet', '/abs/x.jsonl']", "data.val_data=~/d/val.parquet"])
    assert cfg.data.train_data == [os.path.join(home, "d/train.parquet"), "/abs/x.jsonl"]
    assert cfg.data.val_data == [os.path.join(home, "d/val.parquet")]
    assert load_config(["trainer.ckpt_path=~/c"]).trainer.ckpt_path == os.path.join(home, "c")


def test_free_form_dicts_take_nested_keys():
    cfg = load_config(
        [
            "trainer.strategy=deepspeed",
            "deepspeed_config.train.zero_optimization.stage=3",
            "deepspeed_config.train.zero_optimization.offload_param={device: cpu}",
            "deepspeed_config.train.bf16={enabled: true}",
        ]
    )
    expected = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "bf16": {"enabled": True}}
    assert cfg.blocks["deepspeed_config"].train == expected
    assert cfg.blocks["deepspeed_config"].eval == {}


def test_transformer_config_kwargs_free_dict():
    cfg = load_config(
        [
            "trainer.strategy=megatron",
            "trainer.policy.megatron_config.transformer_config_kwargs={num_layers_in_first_pipeline_stage: 3}",
            "trainer.policy.megatron_config.transformer_config_kwargs.attention_dropout=0.0",
        ]
    )
    kwargs = cfg.blocks["trainer.policy.megatron_config"].transformer_config_kwargs
    assert kwargs == {"num_layers_in_first_pipeline_stage": 3, "attention_dropout": 0.0}


def test_later_override_wins():
    assert load_config(["trainer.seed=1", "trainer.seed=2"]).trainer.seed == 2


def test_section_mapping_override_sets_only_named_keys():
    cfg = load_config(["trainer.algorithm={eps_clip_low: 0.1, use_kl_loss: false}"])
    assert cfg.trainer.algorithm.eps_clip_low == 0.1
    assert cfg.trainer.algorithm.use_kl_loss is False
    assert cfg.trainer.algorithm.eps_clip_high == 0.2


def test_layering_defaults_file_overrides_strategy(tmp_path):
    path = _write(
        tmp_path,
        """
        trainer:
          strategy: deepspeed
          seed: 7
          epochs: 3
          policy:
            optimizer_config:
              lr: 2e-5
        generator:
          n_samples_per_prompt: 8
        """,
    )
    from_file = load_config([], config_file=path)
    assert (from_file.trainer.strategy, from_file.trainer.seed, from_file.trainer.epochs) == ("deepspeed", 7, 3)
    assert from_file.trainer.policy.optimizer_config.lr == 2e-5
    assert from_file.trainer.policy.optimizer_config.weight_decay == 0.01, "untouched keys keep their defaults"
    assert from_file.generator.n_samples_per_prompt == 8

    overridden = load_config(["trainer.seed=9", "trainer.strategy=fsdp"], config_file=path)
    assert (overridden.trainer.seed, overridden.trainer.epochs, overridden.trainer.strategy) == (9, 3, "fsdp")

    flagged = load_config(["trainer.strategy=fsdp"], config_file=path, strategy="fsdp2")
    assert flagged.trainer.strategy == "fsdp2"
    assert flagged.trainer.seed == 7


def test_strategy_flag_without_other_layers():
    assert load_config([], strategy="deepspeed").trainer.strategy == "deepspeed"


def test_empty_config_file_changes_nothing(tmp_path):
    assert load_config([], config_file=_write(tmp_path, "# nothing\n")) == load_config([])


def test_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config([], config_file=str(tmp_path / "absent.yaml"))


def test_invalid_yaml_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config([], config_file=_write(tmp_path, "trainer: [1,\n"))


def test_overrides_must_be_a_list():
    with pytest.raises(TypeError, match="list of key=value"):
        load_config("trainer.seed=1")


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=0, max_value=2**62))
def test_any_non_negative_int_seed_round_trips(seed):
    assert load_config([f"trainer.seed={seed}"]).trainer.seed == seed


@settings(max_examples=50, deadline=None)
@given(st.floats(min_value=0, max_value=1e3, allow_nan=False, allow_infinity=False))
def test_any_float_written_by_repr_reads_back_exactly(lr):
    assert load_config([f"trainer.policy.optimizer_config.lr={lr!r}"]).trainer.policy.optimizer_config.lr == lr


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet="abcXYZ019-_./:# ", min_size=1, max_size=20).filter(lambda s: s.strip() not in ("", "~")))
def test_any_run_name_text_is_kept(text):
    assert load_config([f"trainer.run_name={text}"]).trainer.run_name == text.strip()
