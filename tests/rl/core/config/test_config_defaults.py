"""The packaged defaults: they load, validate, agree with the dataclasses, and every field is documented."""

from __future__ import annotations

import ast
import dataclasses
import os
import sys
import typing

import yaml

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import (
    DEFAULTS_PATH,
    Config,
    config_to_dict,
    load_config,
    parallel_sizes,
    schema,
    schema_algorithm,
    schema_data,
    schema_generator,
    schema_models,
    supervised,
)
from rl.core.config.strategies import block_types


def _schema_keys(cls: type, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.metadata.get("strategy_blocks"):
            continue
        key = prefix + field.name
        keys.add(key)
        if dataclasses.is_dataclass(hints[field.name]):
            keys |= _schema_keys(hints[field.name], key + ".")
    return keys


def _yaml_keys(data: dict, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, value in data.items():
        key = prefix + name
        keys.add(key)
        if isinstance(value, dict):
            keys |= _yaml_keys(value, key + ".")
    return keys


def test_defaults_load_and_validate():
    cfg = load_config([])
    assert isinstance(cfg, Config)


def test_exact_on_policy_loads_wherever_it_can_hold():
    """The combinations `checks_exact` lets through (its refusals are rows of tests/testing/bad_configs.py): the
    defaults, and each refused option at the edge of what it allows (a whole distribution, full fine-tuning, one
    rank per sequence, the HF engine on the named strategies that run the Hugging Face model)."""
    edges = ["generator.top_k=-1", "generator.top_p=1.0", "trainer.policy.model.lora.rank=0",
             "trainer.policy.sequence_parallel_size=1", "generator.backend=hf", "trainer.kernels=auto",
             "trainer.bf16=false", "trainer.policy.use_fused_kernels=false"]
    for strategy in ("fsdp2", "fsdp", "deepspeed"):
        cfg = load_config(["trainer.exact_on_policy=true", f"trainer.strategy={strategy}", *edges])
        assert cfg.trainer.exact_on_policy and cfg.trainer.strategy == strategy


def test_yaml_and_dataclasses_name_the_same_keys():
    with open(DEFAULTS_PATH, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    from_yaml = _yaml_keys(data)
    from_schema = _schema_keys(Config)
    assert from_schema - from_yaml == set(), "dataclass fields without a default in defaults.yaml"
    assert from_yaml - from_schema == set(), "defaults.yaml keys without a dataclass field"


def test_dataclasses_carry_no_default_values():
    def walk(cls: type) -> None:
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if field.metadata.get("strategy_blocks"):  # filled by the loader from the strategies' blocks
                continue
            assert field.default is dataclasses.MISSING, f"{cls.__name__}.{field.name} has a default in Python"
            assert field.default_factory is dataclasses.MISSING, f"{cls.__name__}.{field.name} has a default factory"
            if dataclasses.is_dataclass(hints[field.name]):
                walk(hints[field.name])

    walk(Config)


def test_strategy_blocks_stay_out_of_defaults_yaml_and_take_their_dataclass_defaults():
    """A strategy's block has one source of defaults: its dataclass (in rl/backends)."""
    with open(DEFAULTS_PATH, encoding="utf-8") as handle:
        in_yaml = _yaml_keys(yaml.safe_load(handle))
    tree = config_to_dict(load_config([]))
    for key, block in block_types().items():
        assert key not in in_yaml
        node = tree
        for segment in key.split("."):
            node = node[segment]
        assert node == dataclasses.asdict(block())


def test_every_field_has_a_docstring():
    block_names = {block.__name__ for block in block_types().values()}
    modules = {schema, schema_algorithm, schema_data, schema_generator, schema_models, supervised,
               *(sys.modules[block.__module__] for block in block_types().values())}
    for module in modules:
        with open(module.__file__, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)
                    if module in (schema, schema_algorithm, schema_data, schema_generator, schema_models, supervised)
                    or node.name in block_names):
            body = cls.body
            for index, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign):
                    following = body[index + 1] if index + 1 < len(body) else None
                    documented = isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    assert documented, f"{cls.name}.{stmt.target.id} in {os.path.basename(module.__file__)} has no doc"


def test_defaults_match_the_documented_values():
    cfg = load_config([])
    algorithm = cfg.trainer.algorithm
    assert cfg.trainer.strategy == "fsdp2"
    assert cfg.trainer.use_sample_packing is True
    assert cfg.trainer.kernels == "auto"
    assert cfg.trainer.eval_before_train is True
    assert cfg.trainer.logger == ["console"]
    assert cfg.trainer.resume_mode == "none"
    assert cfg.generator.backend == "hf"
    assert (algorithm.advantage_estimator, algorithm.grpo_norm_by_std) == ("grpo", True)
    assert (algorithm.policy_loss_type, algorithm.loss_reduction) == ("regular", "token_mean")
    assert (algorithm.eps_clip_low, algorithm.eps_clip_high, algorithm.clip_ratio_c) == (0.2, 0.2, 3.0)
    assert (algorithm.use_kl_loss, algorithm.kl_loss_coef, algorithm.kl_estimator_type) == (True, 0.001, "k3")
    assert (algorithm.use_entropy_loss, algorithm.entropy_loss_coef) == (False, 0.01)
    assert (algorithm.gamma, algorithm.lambd) == (1.0, 1.0)
    assert (cfg.data.prompt_key, cfg.data.answer_key, cfg.data.reward_fn) == ("prompt", "answer", ["gsm8k"])
    assert cfg.blocks["trainer.policy.fsdp_config"].fsdp_size == -1
    assert cfg.blocks["deepspeed_config"].train == {} and cfg.blocks["deepspeed_config"].eval == {}


def test_user_paths_are_expanded():
    cfg = load_config(["data.train_data=['~/a.parquet']", "data.val_data=['~/b.parquet']",
                       "trainer.ckpt_path=~/ckpt", "trainer.export_path=~/exports"])
    home = os.path.expanduser("~")
    for path in [*cfg.data.train_data, *cfg.data.val_data, cfg.trainer.ckpt_path, cfg.trainer.export_path]:
        assert path.startswith(home + "/"), path


def test_default_types_are_exact():
    data = config_to_dict(load_config([]))
    assert type(data["trainer"]["seed"]) is int
    assert type(data["trainer"]["policy"]["optimizer_config"]["lr"]) is float
    assert type(data["generator"]["top_p"]) is float
    assert data["trainer"]["run_name"] is None


def test_default_parallel_sizes():
    sizes = parallel_sizes(load_config([]))
    assert sizes is not None
    assert (sizes.world, sizes.data_parallel) == (1, 1)


def test_embedded_job_settings_apply_only_to_the_embedded_model(tmp_path):
    with open(os.path.join(os.path.dirname(DEFAULTS_PATH), "embedded_job.yaml"), encoding="utf-8") as handle:
        job = yaml.safe_load(handle)
    embedded = load_config([])
    assert embedded.trainer.policy.optimizer_config.lr == job["trainer"]["policy"]["optimizer_config"]["lr"] == 2e-4
    assert embedded.trainer.max_steps == job["trainer"]["max_steps"]
    assert embedded.generator.n_samples_per_prompt == job["generator"]["n_samples_per_prompt"]

    real = load_config(["trainer.policy.model.path=/models/qwen"])
    assert real.trainer.policy.optimizer_config.lr == 1e-6
    assert real.trainer.max_steps is None
    assert real.generator.n_samples_per_prompt == 4

    assert load_config(["trainer.policy.optimizer_config.lr=5e-5"]).trainer.policy.optimizer_config.lr == 5e-5
    file = tmp_path / "run.yaml"
    file.write_text("trainer:\n  max_steps: 3\n")
    assert load_config([], config_file=str(file)).trainer.max_steps == 3
    file.write_text("trainer:\n  policy:\n    model:\n      path: /models/qwen\n")
    assert load_config([], config_file=str(file)).trainer.policy.optimizer_config.lr == 1e-6

    with open(os.path.join(os.path.dirname(DEFAULTS_PATH), "embedded_vl_job.yaml"), encoding="utf-8") as handle:
        visual_job = yaml.safe_load(handle)
    visual = load_config(["trainer.policy.model.path=embedded-vl"])
    assert visual.trainer.policy.optimizer_config.lr == visual_job["trainer"]["policy"]["optimizer_config"]["lr"]
    assert visual.generator.n_samples_per_prompt == visual_job["generator"]["n_samples_per_prompt"] == 8
