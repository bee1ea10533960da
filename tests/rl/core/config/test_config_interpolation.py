"""`${...}` interpolation in NeMo RL's config files, resolved by OmegaConf: key paths absolute and relative, whole
values keeping their type and interpolations inside strings, NeMo RL's resolvers with nested arguments, chains;
loops, missing keys, `???` and bad calls refused with the file, the key and the fix; and NeMo RL's files give what
NeMo RL's own loading (OmegaConf.load, OmegaConf.merge) gives."""

from __future__ import annotations

import math
import os
import textwrap

import pytest
from omegaconf import DictConfig, OmegaConf

from rl.core.config import ConfigError
from rl.core.config.dialects import nemo_files
from rl.core.config.dialects.interpolation import resolve
from tests.rl.core.config.upstream_configs import NEMO_1B, NEMO_1B_MEGATRON


def _resolve(data: dict) -> dict:
    return resolve(data, "run.yaml")


def _refused(data: dict) -> str:
    [problem] = _all_refused(data)
    return problem


def _all_refused(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _resolve(data)
    return info.value.problems


def _file(tmp_path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


# --- key paths ------------------------------------------------------------------------------------------------------
def test_absolute_key_paths():
    data = {
        "policy": {"model_name": "Qwen/Qwen2.5-1.5B", "megatron_cfg": {"optimizer": {"weight_decay": 0.01}}},
        "lists": {"betas": [0.9, 0.999], "stages": [{"steps": 3}]},
        "name": "${policy.model_name}",
        "scheduler": {"start_weight_decay": "${policy.megatron_cfg.optimizer.weight_decay}"},
        "beta2": "${lists.betas.1}",
        "beta1": "${lists.betas[0]}",
        "steps": "${lists.stages[0].steps}",
    }
    out = _resolve(data)
    assert (out["name"], out["scheduler"]["start_weight_decay"]) == ("Qwen/Qwen2.5-1.5B", 0.01)
    assert (out["beta1"], out["beta2"], out["steps"]) == (0.9, 0.999, 3)


def test_relative_key_paths_count_up_from_the_mapping_that_holds_them():
    data = {
        "precision": "top",
        "policy": {
            "precision": "bfloat16",
            "max_total_sequence_length": 512,
            "generation": {
                "temperature": 0.7,
                "val_temperature": "${.temperature}",  # a sibling
                "max_new_tokens": "${..max_total_sequence_length}",  # the parent's key
                "vllm_cfg": {"precision": "${...precision}", "max_model_len": "${...max_total_sequence_length}"},
            },
        },
        "teacher": {"precision": "float32", "vllm_cfg": {"precision": "${..precision}"}},
    }
    out = _resolve(data)
    generation = out["policy"]["generation"]
    assert (generation["val_temperature"], generation["max_new_tokens"]) == (0.7, 512)
    assert generation["vllm_cfg"] == {"precision": "bfloat16", "max_model_len": 512}
    assert out["teacher"]["vllm_cfg"]["precision"] == "float32"  # relative to where it is written


def test_relative_path_above_the_top_is_refused():
    problem = _refused({"policy": {"x": "${...y}"}})
    assert problem.startswith("config file run.yaml: an interpolation at policy.x ('${...y}') cannot be resolved")
    assert "Error resolving key '...y'" in problem and problem.endswith("fix the key path or add the key")


# --- whole values and strings ---------------------------------------------------------------------------------------
def test_whole_value_keeps_the_type_and_a_string_gets_the_text():
    data = {
        "n": 512,
        "lr": 5.0e-6,
        "on": True,
        "none": None,
        "betas": [0.9, 0.999],
        "block": {"a": 1, "b": "${.a}"},
        "int": "${n}",
        "float": "${lr}",
        "bool": "${on}",
        "null": "${none}",
        "list": "${betas}",
        "mapping": "${block}",
        "text": "run_${n}_${on}_${lr}_${none}",
        "spaced": " ${n}",
        "padded": "${ n }",
    }
    out = _resolve(data)
    assert (out["int"], out["float"], out["bool"], out["null"]) == (512, 5.0e-6, True, None)
    assert type(out["int"]) is int and type(out["bool"]) is bool
    assert out["list"] == [0.9, 0.999] and out["mapping"] == {"a": 1, "b": 1}
    assert out["mapping"] is not out["block"] and out["list"] is not out["betas"]
    assert out["text"] == "run_512_True_5e-06_None"
    assert (out["spaced"], out["padded"]) == (" 512", 512)


def test_a_mapping_inside_a_string_is_written_as_python_writes_it():
    assert _resolve({"block": {"a": 1}, "name": "x_${block}"})["name"] == "x_{'a': 1}"  # str() of the mapping


def test_escaped_interpolation_is_literal_text():
    out = _resolve({"n": 1, "literal": "\\${n}", "backslash": "C:\\\\${n}", "plain": "a\\b"})
    assert out == {"n": 1, "literal": "${n}", "backslash": "C:\\1", "plain": "a\\b"}


def test_the_input_is_left_as_it_was():
    data = {"a": 1, "b": {"c": "${a}"}}
    _resolve(data)
    assert data == {"a": 1, "b": {"c": "${a}"}}


# --- resolvers ------------------------------------------------------------------------------------------------------
def test_nemo_resolvers_with_nested_interpolations():
    data = {
        "policy": {
            "max_total_sequence_length": 512,
            "train_micro_batch_size": 4,
            "megatron_cfg": {"tensor_model_parallel_size": 2, "context_parallel_size": 3},
            "sequence_packing": {
                "train_mb_tokens": "${mul:${..max_total_sequence_length}, ${..train_micro_batch_size}}"
            },
            "divisible_by": "${mul:${mul:${.megatron_cfg.tensor_model_parallel_size}, "
            "${.megatron_cfg.context_parallel_size}}, 2}",
            "factor": "${div:${policy.max_total_sequence_length},${policy.train_micro_batch_size}}",
            "biggest": "${max:${mul:${policy.megatron_cfg.context_parallel_size}, 2}, 16}",
            "sum": "${add:${policy.train_micro_batch_size}, 0.5}",
            "label": "tp${policy.megatron_cfg.tensor_model_parallel_size}-${mul:2, 3}",
        }
    }
    policy = _resolve(data)["policy"]
    assert policy["sequence_packing"]["train_mb_tokens"] == 2048
    assert (policy["divisible_by"], policy["factor"], policy["biggest"], policy["sum"]) == (12, 128.0, 16, 4.5)
    assert policy["label"] == "tp2-6"


@pytest.fixture
def show():
    """A resolver `show` that records its arguments, registered for one test."""
    seen = []

    def record(*args):
        seen.append(args)
        return len(seen)

    OmegaConf.register_new_resolver("show", record, replace=True)
    yield seen
    OmegaConf.clear_resolver("show")


def test_resolver_arguments_are_read_as_omegaconf_grammar_says(show):
    data = {"n": 3, "x": "${show:2, 2.5, true, null, abc, 'a,b', a\\,b, q${n}, ${n}, 1e3, +3, 1_000, TRUE, x y }"}
    _resolve(data)
    [args] = show
    assert args == (2, 2.5, True, None, "abc", "a,b", "a,b", "q3", 3, 1000.0, 3, 1000, True, "x y")
    assert type(args[0]) is int and type(args[9]) is float
    _resolve({"x": "${show:inf}", "y": "${show:}", "z": "${show:[1, 2], {k: v}}"})
    assert math.isinf(show[1][0]) and show[2] == () and show[3] == ([1, 2], {"k": "v"})


def test_oc_env(monkeypatch):
    monkeypatch.setenv("NRL_TEST_HOME", "/data")
    monkeypatch.delenv("NRL_TEST_UNSET", raising=False)
    out = _resolve(
        {
            "path": "${oc.env:NRL_TEST_HOME}/train.jsonl",
            "default": "${oc.env:NRL_TEST_UNSET,5}",
            "none": "${oc.env:NRL_TEST_UNSET,null}",
        }
    )
    assert out == {"path": "/data/train.jsonl", "default": "5", "none": None}
    problem = _refused({"data": {"path": "${oc.env:NRL_TEST_UNSET}/x"}})
    assert "an interpolation at data.path ('${oc.env:NRL_TEST_UNSET}/x')" in problem
    assert "Environment variable 'NRL_TEST_UNSET' not found" in problem and "environment variables" in problem


def test_unknown_resolver_wrong_arguments_and_failing_call_are_refused():
    problem = _refused({"a": "${foo:1}"})
    assert "an interpolation at a ('${foo:1}')" in problem and "Unsupported interpolation type foo" in problem
    assert "use one of NeMo RL's resolvers (mul, add, div, max) or OmegaConf's" in problem
    assert "missing 1 required positional argument: 'b'" in _refused({"a": "${mul:1}"})
    problem = _refused({"a": "${div:1, 0}"})
    assert "an interpolation at a ('${div:1, 0}')" in problem and "ZeroDivisionError" in problem


def test_the_rest_of_omegaconfs_grammar():
    out = _resolve({"b": "k", "x": {"k": 5}, "a": "${x.${b}}", "twice": "${mul:[1, 2], 2}", "pick": "${oc.select:q,7}"})
    assert (out["a"], out["twice"], out["pick"]) == (5, [1, 2, 1, 2], 7)
    for text in ("${b", "${}"):
        problem = _refused({"a": text})
        assert f"an interpolation at a ({text!r})" in problem and "OmegaConf's interpolation grammar" in problem


# --- chains, loops, missing keys --------------------------------------------------------------------------------------
def test_chains_resolve_in_any_order():
    data = {
        "first": "${second}",  # refers forward to a key that is itself interpolated
        "second": "${mul:${third}, 2}",
        "third": "${policy.train_micro_batch_size}",
        "policy": {"train_micro_batch_size": 4, "logprob_batch_size": "${.train_micro_batch_size}"},
        "copy": "${policy}",  # a mapping whose keys interpolate: copied resolved
        "through": "${copy.logprob_batch_size}",  # a path through an interpolated key
    }
    out = _resolve(data)
    assert (out["first"], out["second"], out["third"]) == (8, 8, 4)
    assert out["copy"] == {"train_micro_batch_size": 4, "logprob_batch_size": 4} and out["through"] == 4


def test_loops_are_refused_naming_the_keys():
    problems = _all_refused({"a": "${b}", "b": "${c.d}", "c": {"d": "${a}"}})
    assert [problem.split(" (")[0] for problem in problems] == [
        f"config file run.yaml: an interpolation at {key}" for key in ("a", "b", "c.d")
    ]
    assert all("refer to each other in a loop: write one of the values out" in problem for problem in problems)
    assert "Recursive interpolation detected" in _refused({"self": "x${self}"})
    assert "Interpolation to parent node detected" in _refused({"a": {"b": "${a}"}})  # a mapping holding its copy


def test_unset_values_are_refused_naming_the_key():
    problems = _all_refused({"model": "???", "a": "${model}", "l": [1, "???"]})
    assert problems == [
        "config file run.yaml: model is '???' (OmegaConf's mark for a value left for you to set); set model",
        "config file run.yaml: an interpolation at a ('${model}') cannot be resolved (MissingMandatoryValue while "
        "resolving interpolation: Missing mandatory value: model); set the value it names",
        "config file run.yaml: l[1] is '???' (OmegaConf's mark for a value left for you to set); set l[1]",
    ]


def test_missing_key_is_refused_naming_the_file_and_the_key(tmp_path):
    path = _file(
        tmp_path, "policy:\n  max_total_sequence_length: 512\n  max_new_tokens: ${policy.max_total_seq_length}\n"
    )
    with pytest.raises(ConfigError) as info:
        nemo_files.read_config_file(path)
    [problem] = info.value.problems
    assert problem == (
        f"config file {path}: an interpolation at policy.max_new_tokens ('${{policy.max_total_seq_length}}') cannot "
        "be resolved (Interpolation key 'policy.max_total_seq_length' not found (did you mean "
        "'max_total_sequence_length'?)); fix the key path or add the key"
    )
    assert "Interpolation key 'nothing.x' not found" in _refused({"a": "${nothing.x}"})
    assert "node `policy` is not a container and thus cannot contain `x`" in _refused({"policy": 4, "a": "${policy.x}"})
    assert "Interpolation key 'betas.2' not found" in _refused({"betas": [1, 2], "a": "${betas.2}"})
    # a chain: each key on it is named, the one that holds the missing key among them
    problems = _all_refused({"first": "${second}", "second": "${x.second}", "x": {"second": "${.bad}"}})
    assert [problem.split(" (")[0].split(": ")[1] for problem in problems] == [
        f"an interpolation at {key}" for key in ("first", "second", "x.second")
    ]


def test_a_file_with_defaults_folded_lines_and_a_childs_values(tmp_path):
    _file(
        tmp_path,
        """\
        policy:
          train_micro_batch_size: 2
          dtensor_cfg: {tensor_parallel_size: 2, context_parallel_size: 2}
          make_sequence_length_divisible_by: ${mul:${policy.dtensor_cfg.tensor_parallel_size},
            ${mul:2, ${policy.dtensor_cfg.context_parallel_size}}}
          logprob_batch_size: ${.train_micro_batch_size}
        """,
        name="parent.yaml",
    )
    child = _file(
        tmp_path,
        "defaults: parent.yaml\npolicy:\n  train_micro_batch_size: 8\n  dtensor_cfg:\n    context_parallel_size: 4\n",
    )
    policy = nemo_files.read_config_file(child)["policy"]
    assert (policy["make_sequence_length_divisible_by"], policy["logprob_batch_size"]) == (16, 8)


def test_upstream_nemo_files_resolve():
    megatron = nemo_files.read_config_file(NEMO_1B_MEGATRON)
    policy = megatron["policy"]
    assert policy["sequence_packing"]["train_mb_tokens"] == policy["max_total_sequence_length"] * 4
    assert policy["generation"]["vllm_cfg"]["max_model_len"] == policy["max_total_sequence_length"]
    plain = nemo_files.read_config_file(NEMO_1B)
    assert plain["policy"]["generation"]["val_temperature"] == plain["policy"]["generation"]["temperature"]
    assert "${" not in repr(plain) and "${" not in repr(megatron)


def test_repeated_loads_in_one_process_give_the_same_values(tmp_path):
    path = _file(tmp_path, "a: 2\nb: ${mul:${a}, 3}\nc: ${oc.env:NRL_TEST_REPEAT,x}\n")
    assert [nemo_files.read_config_file(path) for _ in range(2)] == [{"a": 2, "b": 6, "c": "x"}] * 2
    os.environ["NRL_TEST_REPEAT"] = "y"  # nothing is cached between loads
    try:
        assert nemo_files.read_config_file(path)["c"] == "y"
    finally:
        del os.environ["NRL_TEST_REPEAT"]


# --- against NeMo RL's own loading -----------------------------------------------------------------------------------
def _nemo_load(path: str) -> DictConfig:
    """A file loaded the way nemo_rl/utils/config.py loads it: OmegaConf.load, each `defaults:` file (relative to the
    file) loaded the same way and merged in order with OmegaConf.merge, the file merged last; a mapping marked
    `_override_: true` takes the inherited one's place instead of merging into it."""
    config = OmegaConf.load(path)
    if "defaults" not in config:
        return config
    defaults = config.pop("defaults")
    merged = OmegaConf.create({})
    for name in [defaults] if isinstance(defaults, str) else list(defaults):
        merged = _nemo_merge(merged, _nemo_load(os.path.join(os.path.dirname(path), name)))
    return _nemo_merge(merged, config)


def _nemo_merge(base: DictConfig, update: DictConfig) -> DictConfig:
    for key in list(update.keys()):
        if isinstance(update[key], DictConfig) and update[key].get("_override_", False):
            update[key].pop("_override_")
            base.pop(key, None)
    return OmegaConf.merge(base, update)


def test_same_values_as_nemo_rls_loading(tmp_path):
    _file(
        tmp_path,
        """\
        n: 3
        lr: 1.0e-5
        flag: false
        betas: [0.9, 0.999]
        block: {k: 1, sibling: "${.k}", up: "${..n}", deep: {x: "${...n}"}}
        copy: ${block}
        through: ${copy.deep.x}
        text: a_${flag}_${lr}_${n}
        index: ${betas[1]}
        escaped: \\${n}
        calls: ${max:${mul:${n}, 2}, ${add:1, 2.5}}
        div: ${div:${n}, 2}
        chain: ${calls}
        replaced: {a: 1, b: 2}
        """,
        name="parent.yaml",
    )
    child = _file(tmp_path, "defaults: parent.yaml\nn: 5\nreplaced: {_override_: true, c: \"${n}\"}\n")
    for path in (NEMO_1B, NEMO_1B_MEGATRON, child):
        expected = OmegaConf.to_container(_nemo_load(path), resolve=True)
        assert repr(nemo_files.read_config_file(path)) == repr(expected), path
    assert nemo_files.read_config_file(child)["replaced"] == {"c": 5}
