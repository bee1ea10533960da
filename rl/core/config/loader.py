"""Building a Config: defaults.yaml (< embedded_job.yaml) < user YAML file < key=value overrides < --strategy,
then validation."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl.core.config import strategies
from rl.core.config.convert import build, to_dict
from rl.core.config.defaults import JOB_FILES, default_tree, embedded_job_tree
from rl.core.config.dialects import DIALECTS, Item, Report, translate
from rl.core.config.dialects.nemo_files import read_config_file
from rl.core.config.errors import Problems
from rl.core.config.keys import known, lookup
from rl.core.config.merge import flatten, merge_free, set_key
from rl.core.config.overrides import parse_value, split_override
from rl.core.config.schema import Config
from rl.core.config.validate import collect_problems
from rl.core.config.yaml_io import dump_yaml, write_atomic

PATH_KEYS = (
    "data.train_data",
    "data.val_data",
    "data.prompt_template_file",
    "data.system_prompt_file",
    "trainer.ckpt_path",
    "trainer.export_path",
    "trainer.policy.model.path",
    "trainer.resume_mode",
)
"""Keys whose values (a path or a list of paths) get `~` expanded."""
logger = logging.getLogger("rl.core.config")


def load_config(
    overrides: Sequence[str] = (),
    config_file: str | None = None,
    strategy: str | None = None,
    auto: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Config:
    """The validated config of a run.

    Layers, each over the one before: rl/core/config/defaults.yaml; `config_file` (a YAML mapping with the same
    nested keys; NeMo RL's `defaults:` inheritance and `${...}` interpolation are read); `overrides` (`key=value`,
    the value read as YAML, so lists are written `"['a','b']"`); `strategy` (the `--strategy` flag, which wins over
    trainer.strategy). In the file and the overrides, SkyRL's and NeMo RL's keys are read as ours
    (`rl.core.config.dialects`), in the place where they appear. When the layers leave `trainer.policy.model.path` at
    `embedded`, embedded_job.yaml (the embedded default job's learning rate, length and sampling) goes between the
    defaults and the user's layers (at `embedded-vl`, embedded_vl_job.yaml). Then `~` in paths is expanded and
    every check runs; all problems are raised together as one ConfigError. What the dialects did is logged (INFO,
    logger `rl.core.config`), one line each.
    `trainer.strategy=auto` is resolved by `auto` (the launchers pass the memory planner's,
    `rl.trainer.preflight.memory_plan.resolve_auto`): it returns the keys of the layout it chose, set before the checks.
    """
    strategies.require_strategies()
    problems, report, tree = _layered(default_tree(), overrides, config_file, strategy)
    job = tree.get("trainer", {}).get("policy", {}).get("model", {}).get("path")
    if job in JOB_FILES:
        problems, report, tree = _layered(embedded_job_tree(job), overrides, config_file, strategy)
    if tree.get("trainer", {}).get("strategy") == strategies.AUTO:
        _resolve_auto(tree, auto, problems, report)
    elif isinstance(tree.get("trainer"), dict) and tree["trainer"].get("auto_choice") is not None:
        tree["trainer"]["auto_choice"] = None  # a record of an earlier auto choice; this run names its strategy
    return _build_checked(tree, problems, report)


def _resolve_auto(tree: dict[str, Any], auto, problems: Problems, report: Report) -> None:
    if auto is None:
        problems.add(
            "trainer.strategy",
            "auto is resolved by the launchers (rl.launch.train, rl.launch.plan), which "
            "ask the memory planner; name a strategy here",
        )
        set_key(tree, "trainer.strategy", default_tree()["trainer"]["strategy"], problems)
        return
    for key, value in auto(tree).items():
        set_key(tree, key, value, problems)
    report.lines.append(f"trainer.strategy=auto: {tree['trainer'].get('auto_choice')}")


def _layered(tree: dict[str, Any], overrides: Sequence[str], config_file: str | None, strategy: str | None):
    """The file's items and the overrides' in one layer, the overrides after: a dialect rule that reads several keys
    together (NeMo RL's data blocks) sees the command line's values over the file's, as every other key does."""
    problems, report = Problems(), Report()
    items = _file_items(config_file, problems) if config_file is not None else []
    items = _with_overrides(items, overrides, problems)
    for item in translate(items, tree, problems, report, DIALECTS):
        if item.raw:  # a key=value text, typed by the key of ours it lands on
            node = lookup(item.key, problems)
            if node is None:
                continue
            ok, value = parse_value(item.key, item.value, node, problems)
            if ok:
                set_key(tree, item.key, value, problems)
        else:
            set_key(tree, item.key, item.value, problems)
    if strategy is not None:
        set_key(tree, "trainer.strategy", strategy, problems)
    _expand_paths(tree)
    return problems, report, tree


def config_from_dict(data: Mapping[str, Any], validate: bool = True) -> Config:
    """A Config from a complete nested mapping (as `config_to_dict` returns). Every key must be present and known
    (a strategy's block that is absent takes its defaults); types are checked, and with `validate` every value
    check runs too."""
    problems = Problems()
    cfg = _build(data, problems)
    if cfg is not None and validate:
        problems.lines.extend(collect_problems(cfg))
    problems.raise_if_any()
    return cfg


def _build(data: Mapping[str, Any], problems: Problems) -> Config | None:
    """The typed Config of a plain tree: the strategies' blocks (typed by their own dataclasses, over their
    defaults) into `Config.blocks`, the rest into the schema's dataclasses."""
    strategies.require_strategies()
    tree = copy.deepcopy(dict(data))
    blocks = {}
    for key, block in strategies.block_types().items():
        merged = strategies.block_defaults(block)
        given = _pop_key(tree, key)
        if given is not None:
            if not isinstance(given, Mapping):
                problems.add(key, f"is a section, not a single value; set its keys instead, e.g. {key}.<name>=...")
                continue
            merge_free(merged, given)
        blocks[key] = build(block, merged, key + ".", problems)
    cfg = build(Config, tree, "", problems)
    if cfg is None or any(block is None for block in blocks.values()):
        return None
    cfg.blocks = blocks
    return cfg


def _pop_key(tree: dict[str, Any], key: str) -> Any:
    *parents, last = key.split(".")
    node: Any = tree
    for segment in parents:
        node = node.get(segment) if isinstance(node, dict) else None
    return node.pop(last, None) if isinstance(node, dict) else None


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain nested dicts and lists (a deep copy), the strategies' blocks at their keys."""
    tree = to_dict(cfg)
    for key, block in tree.pop("blocks").items():
        *parents, last = key.split(".")
        node = tree
        for segment in parents:
            node = node.setdefault(segment, {})
        node[last] = block
    return tree


def save_config(cfg: Config, path: str) -> None:
    """Write the resolved config as YAML, atomically (a temporary file, then a rename). It loads back equal with
    `load_config([], config_file=path)`."""
    write_atomic(path, dump_yaml(config_to_dict(cfg)))


def _file_items(path: str, problems: Problems) -> list[Item]:
    data = read_config_file(path)
    if data is None:
        return []
    if not isinstance(data, Mapping):
        problems.add(f"config file {path}", "must hold a mapping of sections (trainer:, generator:, data:, ...)")
        return []
    return [Item(key, value, False) for key, value in flatten(data)]


def _with_overrides(items: list[Item], overrides: Sequence[str], problems: Problems) -> list[Item]:
    """`items` followed by the overrides' (`key=value`), Hydra's `~key` dropping what the items before it set for
    `key` or under it (a key of ours goes back to its default)."""
    if isinstance(overrides, str):
        raise TypeError("load_config takes a list of key=value strings, not one string")
    items = list(items)
    for text in overrides:
        if text.startswith("~"):
            key = text[1:].partition("=")[0].strip()
            kept = [item for item in items if not (item.key == key or item.key.startswith(key + "."))]
            if len(kept) == len(items) and not known(key):
                problems.add(text, f"nothing sets {key} to delete (Hydra's ~key drops a key the config file or an "
                                   "earlier override sets); check the name")
            items = kept
            continue
        override = split_override(text, problems)
        if override is not None:
            items.append(Item(override.key, override.raw, True))
    return items


def _expand_paths(tree: dict[str, Any]) -> None:
    for key in PATH_KEYS:
        *parents, last = key.split(".")
        holder: Any = tree
        for segment in parents:
            holder = holder.get(segment) if isinstance(holder, dict) else None
        if not isinstance(holder, dict):
            continue
        value = holder.get(last)
        if isinstance(value, str):
            holder[last] = os.path.expanduser(value)
        elif isinstance(value, list):
            holder[last] = [os.path.expanduser(item) if isinstance(item, str) else item for item in value]


def _build_checked(tree: dict[str, Any], problems: Problems, report: Report) -> Config:
    for warning in problems.warnings:
        logger.warning("%s", warning)
    cfg = _build(tree, problems)
    if cfg is not None:
        problems.lines.extend(collect_problems(cfg))
        for key, check in report.later:
            problem = check(cfg)
            if problem:
                problems.add(key, problem)
    for line in report.messages():
        logger.info("%s", line)
    problems.raise_if_any()
    return cfg
