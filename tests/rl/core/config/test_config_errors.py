"""Bad configs fail at load time with a ConfigError whose line names the offending key and the fix."""

from __future__ import annotations

import textwrap

import pytest
import yaml

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import ConfigError, load_config, ref_world_size
from tests.testing.bad_configs import BAD, MEGATRON, WORLD_4, Bad


@pytest.mark.parametrize("case", list(BAD.values()), ids=list(BAD))
def test_bad_config_names_the_key(case: Bad):
    with pytest.raises(ConfigError) as info:
        load_config(case.overrides, strategy=case.strategy)
    lines = [line for line in info.value.problems if line.startswith(case.key + ":")]
    assert lines, f"no problem names {case.key}: {info.value.problems}"
    for fragment in case.fragments:
        assert any(fragment in line for line in lines), f"{fragment!r} missing from {lines}"
    assert isinstance(info.value, ValueError)


def test_a_rule_refusal_is_one_whole_line():
    """A value rule's line word for word: the key, the value, the requirement; no suggestion added to a number."""
    with pytest.raises(ConfigError) as info:
        load_config(["trainer.algorithm.clip_ratio_c=1.0"])
    assert info.value.problems == ["trainer.algorithm.clip_ratio_c: got 1.0; set it to a number > 1"]


def test_all_problems_are_reported_together_one_line_each():
    with pytest.raises(ConfigError) as info:
        load_config(
            [
                "trainer.sed=1",
                "generator.top_p=2",
                "trainer.strategy=fsdp",
                "trainer.policy.fsdp_config.cpu_offload=true",
                "trainer.train_batch_size=24",
            ]
        )
    problems = info.value.problems
    keys = [line.split(":")[0] for line in problems]
    assert keys == [
        "trainer.sed",
        "generator.top_p",
        "trainer.train_batch_size",
        "trainer.policy.fsdp_config.cpu_offload",
    ]
    message = str(info.value)
    assert message.splitlines()[0] == "invalid config (4 problems):"
    assert len(message.splitlines()) == 5


def test_type_errors_are_reported_with_unknown_keys():
    with pytest.raises(ConfigError) as info:
        load_config(["trainer.seed=abc", "trainer.epochs=1.5", "data.promt_key=q"])
    keys = sorted(line.split(":")[0] for line in info.value.problems)
    assert keys == ["data.promt_key", "trainer.epochs", "trainer.seed"]


def test_unknown_keys_in_a_file_are_named_with_suggestions(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(
            """
            trainer:
              algorithm:
                kl_los_coef: 0.1
            generator:
              n_sample_per_prompt: 8
            dataa: {}
            """
        ),
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_config([], config_file=str(path))
    message = str(info.value)
    assert "trainer.algorithm.kl_los_coef: unknown key (did you mean 'trainer.algorithm.kl_loss_coef'?)" in message
    assert "generator.n_sample_per_prompt: unknown key (did you mean 'generator.n_samples_per_prompt'?)" in message
    assert "dataa: unknown key (did you mean 'data'?)" in message


def test_wrong_types_in_a_file_are_named(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  seed: abc\n  policy: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config([], config_file=str(path))
    message = str(info.value)
    assert "trainer.seed: expected an integer" in message
    assert "trainer.policy: is a section" in message


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(
            [
                *WORLD_4,
                "trainer.strategy=megatron",
                MEGATRON + "tensor_model_parallel_size=2",
                MEGATRON + "sequence_parallel=true",
            ],
            id="megatron_tp2_dp2",
        ),
        pytest.param(
            [
                "trainer.placement.policy_num_gpus_per_node=8",
                "trainer.placement.ref_num_gpus_per_node=8",
                "trainer.strategy=megatron",
                MEGATRON + "tensor_model_parallel_size=2",
                MEGATRON + "pipeline_model_parallel_size=2",
                MEGATRON + "expert_model_parallel_size=2",
            ],
            id="megatron_tp2_pp2_ep2_world8",
        ),
        pytest.param(
            [
                *WORLD_4,
                "trainer.strategy=fsdp",
                "trainer.ref.fsdp_config.cpu_offload=true",
                "trainer.policy.fsdp_config.fsdp_size=2",
            ],
            id="fsdp1_ref_offload_hsdp",
        ),
        pytest.param(["trainer.strategy=fsdp2", "trainer.policy.fsdp_config.cpu_offload=true"], id="fsdp2_offload"),
        pytest.param(
            ["trainer.strategy=deepspeed", "deepspeed_config.train={zero_optimization: {stage: 3}}"],
            id="deepspeed_zero3",
        ),
        pytest.param(
            ["trainer.algorithm.advantage_estimator=reinforce++", "generator.n_samples_per_prompt=1"],
            id="reinforce_pp_one_sample",
        ),
        pytest.param(["generator.eval_temperature=0"], id="greedy_eval"),
        pytest.param(["trainer.policy.optimizer_config.betas=[0.0, 0.999]"], id="beta_of_zero"),
        pytest.param(["data.val_split_size=1.0"], id="one_validation_row"),
    ],
)
def test_valid_layouts_are_accepted(overrides):
    """Accepted as given: the load raises nothing, and every key reads back the value its override wrote (the
    override's text read by PyYAML), none dropped or reset to a default on the way."""
    cfg = load_config(overrides)
    for override in overrides:
        key, text = override.split("=", 1)
        assert _loaded_value(cfg, key) == yaml.safe_load(text), override


def _loaded_value(cfg, key: str):
    """A dotted key's value in the loaded config: under a strategy's block (`cfg.blocks`, by its dotted key) or the
    schema's sections."""
    block = max((name for name in cfg.blocks if key.startswith(name + ".")), key=len, default=None)
    node, rest = (cfg.blocks[block], key[len(block) + 1:]) if block else (cfg, key)
    for part in rest.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def test_resume_from_an_existing_directory_is_accepted(tmp_path):
    assert load_config([f"trainer.resume_mode={tmp_path}"]).trainer.resume_mode == str(tmp_path)


def test_colocated_reference_follows_the_policy_placement():
    cfg = load_config(["trainer.placement.policy_num_gpus_per_node=2"])
    assert ref_world_size(cfg) == 2


def test_a_key_given_twice_in_a_file_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  seed: 1\n  seed: 2\n")
    with pytest.raises(ConfigError, match="key 'seed' appears twice in one mapping"):
        load_config([], config_file=str(path))


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_bytes("trainer:\n  run_name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=f"config file {path}: is not UTF-8 text"):
        load_config([], config_file=str(path))
