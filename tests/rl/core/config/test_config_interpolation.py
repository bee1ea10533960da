"""`${...}` interpolation in NeMo RL's config files, read without OmegaConf: key paths absolute and relative, whole
values keeping their type and interpolations inside strings, NeMo RL's resolvers with nested arguments, chains,
loops and missing keys refused with the file and the key; and, where omegaconf is installed, the same values as
OmegaConf gives on NeMo RL's files."""

from __future__ import annotations

import math
import textwrap

import pytest

from rl.core.config import ConfigError
from rl.core.config.dialects import nemo_files
from rl.core.config.dialects.interpolation import resolve
from tests.rl.core.config.upstream_configs import NEMO_1B, NEMO_1B_MEGATRON


def _resolve(data: dict) -> dict:
    return resolve(data, "run.yaml", nemo_files.NEMO_RESOLVERS)


def _refused(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        _resolve(data)
    [problem] = info.value.problems
    return problem


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
    assert "an interpolation at policy.x" in problem and "above the top of the file" in problem


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


def test_a_mapping_inside_a_string_is_refused():
    problem = _refused({"block": {"a": 1}, "name": "x_${block}"})
    assert "an interpolation at name" in problem and "${block} is a mapping" in problem


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


def test_resolver_arguments_are_read_as_omegaconf_reads_them():
    seen = []

    def show(*args):
        seen.append(args)
        return len(seen)

    data = {"n": 3, "x": "${show:2, 2.5, true, null, abc, 'a,b', a\\,b, q${n}, ${n}, 1e3, +3, 1_000, TRUE, x y }"}
    resolve(data, "run.yaml", {"show": show})
    [args] = seen
    assert args == (2, 2.5, True, None, "abc", "a,b", "a,b", "q3", 3, 1000.0, 3, 1000, True, "x y")
    assert type(args[0]) is int and type(args[9]) is float
    resolve({"x": "${show:inf}", "y": "${show:}"}, "run.yaml", {"show": show})
    assert math.isinf(seen[1][0]) and seen[2] == ()


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
    assert "an interpolation at data.path" in problem and "NRL_TEST_UNSET, which is not set" in problem
    assert "set NRL_TEST_UNSET" in problem


def test_unknown_resolver_wrong_arguments_and_failing_call_are_refused():
    assert "'foo', which is not a resolver read here (these are: add, div, max, mul, oc.env)" in _refused(
        {"a": "${foo:1}"}
    )
    assert "${mul:1} gives 'mul' 1 argument, and it takes 2" in _refused({"a": "${mul:1}"})
    problem = _refused({"a": "${div:1, 0}"})
    assert "an interpolation at a" in problem and "ZeroDivisionError" in problem


def test_grammar_outside_the_subset_is_refused():
    assert "inside a key path is not read here" in _refused({"b": "x", "a": "${x.${b}}"})
    assert "lists and mappings as resolver arguments are not read here" in _refused({"a": "${mul:[1, 2], 2}"})
    assert "is not closed" in _refused({"a": "${b"})
    assert "names no key" in _refused({"a": "${}"})


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
    problem = _refused({"a": "${b}", "b": "${c.d}", "c": {"d": "${a}"}})
    assert problem.startswith("config file run.yaml: the interpolations at a -> b -> c.d -> a refer to each other")
    assert "write one of the values out" in problem
    assert "at self -> self refer" in _refused({"self": "x${self}"})
    assert "at a -> a.b -> a refer" in _refused({"a": {"b": "${a}"}})  # a mapping that holds its own copy


def test_missing_key_is_refused_naming_the_file_and_the_key(tmp_path):
    path = _file(
        tmp_path, "policy:\n  max_total_sequence_length: 512\n  max_new_tokens: ${policy.max_total_seq_length}\n"
    )
    with pytest.raises(ConfigError) as info:
        nemo_files.read_config_file(path)
    [problem] = info.value.problems
    assert problem.startswith(f"config file {path}: an interpolation at policy.max_new_tokens cannot be resolved")
    assert "${policy.max_total_seq_length} names policy.max_total_seq_length" in problem
    assert "(did you mean 'max_total_sequence_length'?)" in problem
    assert problem.endswith("fix the key path or add the key")
    assert "the file has no key 'nothing'" in _refused({"a": "${nothing.x}"})
    assert "policy holds 4, not a mapping with a key 'x'" in _refused({"policy": 4, "a": "${policy.x}"})
    assert "betas is a list of 2, which has no item '2'" in _refused({"betas": [1, 2], "a": "${betas.2}"})
    assert "which is '???' (a value left for you to set)" in _refused({"model": "???", "a": "${model}"})


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


# --- against OmegaConf, where it is installed -----------------------------------------------------------------------
FEATURES = {
    "n": 3,
    "lr": 1.0e-5,
    "on": False,
    "betas": [0.9, 0.999],
    "block": {"k": 1, "sibling": "${.k}", "up": "${..n}", "deep": {"x": "${...n}"}},
    "copy": "${block}",
    "through": "${copy.deep.x}",
    "text": "a_${on}_${lr}_${n}",
    "index": "${betas[1]}",
    "escaped": "\\${n}",
    "calls": "${max:${mul:${n}, 2}, ${add:1, 2.5}}",
    "div": "${div:${n}, 2}",
    "chain": "${calls}",
}


def test_same_values_as_omegaconf():
    omegaconf = pytest.importorskip(
        "omegaconf", reason="omegaconf is not installed; the hand-written cases above cover the same grammar"
    )
    OmegaConf = omegaconf.OmegaConf
    for name, function in nemo_files.NEMO_RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)
    for path in (NEMO_1B, NEMO_1B_MEGATRON):
        merged = nemo_files._read_with_defaults(path, ())
        expected = OmegaConf.to_container(OmegaConf.create(merged), resolve=True)
        assert repr(resolve(merged, path, nemo_files.NEMO_RESOLVERS)) == repr(expected), path
    expected = OmegaConf.to_container(OmegaConf.create(FEATURES), resolve=True)
    assert repr(_resolve(FEATURES)) == repr(expected)
