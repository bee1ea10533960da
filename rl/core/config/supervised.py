"""The `sft:` and `dpo:` blocks of the supervised and preference launchers (`rl.launch.sft`, `rl.launch.dpo`): their
keys, each documented below as the schema's are (`rl.core.config.schema`), and how they are read.

Everything else (model, strategy and its block, batch sizes, optimizer, checkpoints, exports, data files) is the
RL config's (`load_config`): `split_overrides` takes the block out of the config file and the command line, reads
SkyRL's SFT names and NeMo RL's `sft:` / `dpo:` names (the tables below: an alias to the key of ours with the same
meaning, accepted with no effect, or refused naming the feature), checks every key and type as the loader does, and
leaves the rest to the loader. The run directory's config.yaml holds the block beside the rest
(`save_supervised_config`), so `--config=<run>/config.yaml` runs the same job again.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rl.core.config.convert import build, describe_value
from rl.core.config.dialects.entries import Alias, Inert, Refused, feature_off, ignored, speed_only
from rl.core.config.dialects.layer import Report
from rl.core.config.errors import Problems, did_you_mean
from rl.core.config.keys import Kind, Node
from rl.core.config.overrides import parse_value
from rl.core.config.yaml_io import dump_yaml, write_atomic

LOSS_REDUCTIONS = ("token_mean", "sequence_mean")
DPO_LOSS_TYPES = ("sigmoid", "ipo")


@dataclass(frozen=True, kw_only=True)
class SftConfig:
    """The `sft:` block of `rl.launch.sft`: where the conversations are in the rows and how long they may be."""

    messages_key: str = "messages"
    """Column of chat-format rows: a list of {role, content} messages (SkyRL's `messages_key`); the loss covers
    every assistant turn."""

    prompt_key: str = "prompt"
    """Column of the prompt (text, or a list of messages) where rows have no `messages_key` column."""

    response_key: str = "response"
    """Column of the assistant's response beside `prompt_key`."""

    max_length: int = 2048
    """Longest example in tokens, chat template included (SkyRL's `max_length`), >= 2."""

    truncate: bool = False
    """A longer example is refused (false) or cut to `max_length` (true)."""

    loss_reduction: str = "token_mean"
    """How token losses are reduced over the mini-batch: `token_mean` (every assistant token weighs the same) or
    `sequence_mean` (every example weighs the same)."""


@dataclass(frozen=True, kw_only=True)
class DpoConfig:
    """The `dpo:` block of `rl.launch.dpo`: the preference loss and where the pairs are in the rows."""

    beta: float = 0.1
    """The DPO temperature beta (NeMo RL's `reference_policy_kl_penalty`), > 0."""

    loss_type: str = "sigmoid"
    """`sigmoid` (DPO: -log sigmoid(beta * margin)) or `ipo` ((margin - 1 / (2 beta))^2)."""

    preference_loss_weight: float = 1.0
    """Weight of the preference loss in the total (NeMo RL's key), >= 0."""

    sft_loss_weight: float = 0.0
    """Weight of the chosen response's NLL added to the preference loss (NeMo RL's key), >= 0; 0 leaves it out."""

    sft_average_log_probs: bool = False
    """The SFT term's NLL is the mean over the chosen response's tokens (true) or their sum (false, NeMo RL's
    default), averaged over the pairs either way (NeMo RL's key)."""

    preference_average_log_probs: bool = False
    """Log-ratios as means over the response's tokens instead of sums (NeMo RL's key; IPO's length
    normalisation)."""

    prompt_key: str = "prompt"
    """Column of the prompt: text, or a list of {role, content} messages."""

    chosen_key: str = "chosen"
    """Column of the preferred response (text, or a list of messages whose last one is the response)."""

    rejected_key: str = "rejected"
    """Column of the dispreferred response, as `chosen_key`; a row whose two responses are identical is refused."""

    max_length: int = 2048
    """Longest prompt + response in tokens, chat template included, >= 2."""

    truncate: bool = False
    """A longer example is refused (false) or cut to `max_length` (true)."""


def _nemo_loss(value: Any) -> str:
    """NeMo RL's `preference_loss` names (dpo, ipo, rpo_sq, rpo_bwd_kl, rpo_fwd_kl) as `dpo.loss_type`."""
    if value not in ("dpo", "ipo"):
        raise ValueError("the preference losses here are dpo (dpo.loss_type=sigmoid) and ipo")
    return "sigmoid" if value == "dpo" else "ipo"


_VAL = {
    "val_period": Alias("trainer.eval_interval"),
    "val_at_start": Alias("trainer.eval_before_train"),
    "val_at_end": Inert("with an evaluation interval the last step is evaluated here"),
    "val_batches": Inert("every row of data.val_data is evaluated here, as NeMo RL does at 0",
                         lambda value: value is None or (isinstance(value, int) and value <= 0),
                         "evaluating only the first val_batches batches of the validation data",
                         "every row of data.val_data is evaluated here: point data.val_data at the rows to evaluate "
                         "and remove it (or set it to 0)"),
    "val_global_batch_size": speed_only("evaluation batching"),
    "val_micro_batch_size": speed_only("evaluation batching"),
    "seed": Alias("trainer.seed"),
    "max_num_steps": Alias("trainer.max_steps", differs="trainer.max_steps wins over trainer.epochs here (the data "
                           "is reshuffled for another epoch when the steps outlast it); NeMo RL stops at whichever "
                           "of max_num_steps and max_num_epochs comes first"),
    "max_num_epochs": Alias("trainer.epochs", differs="counts only while trainer.max_steps is null here; NeMo RL "
                            "stops at whichever of max_num_steps and max_num_epochs comes first"),
}
"""NeMo RL's keys that its `sft:` and `dpo:` blocks share (its SFTConfig and DPOConfig)."""
NEMO_SFT = {
    **_VAL,
    "only_unmask_final": feature_off("the loss on the final assistant turn only",
                                     "the loss covers every assistant turn here; keep only the last in the data"),
}
"""NeMo RL's `sft:` keys (examples/configs/sft.yaml) and what each does here."""
NEMO_DPO = {
    **_VAL,
    "reference_policy_kl_penalty": Alias("dpo.beta"),
    "preference_loss": Alias("dpo.loss_type", convert=lambda value: _nemo_loss(value)),
    "gt_reward_scale": ignored("used only with the RPO losses, which are not available here"),
}
"""NeMo RL's `dpo:` keys (examples/configs/dpo.yaml) and what each does here; `sft_loss_weight`,
`preference_loss_weight`, `sft_average_log_probs` and `preference_average_log_probs` are ours with its meaning."""
SKYRL_SFT = {"num_steps": Alias("trainer.max_steps"), "num_epochs": Alias("trainer.epochs"),
             "batch_size": Alias("trainer.train_batch_size")}
"""SkyRL's SFTConfig names."""
BLOCKS = {"sft": (SftConfig, (("NeMo RL", NEMO_SFT), ("SkyRL", SKYRL_SFT))),
          "dpo": (DpoConfig, (("NeMo RL", NEMO_DPO),))}
LAUNCHERS = {"sft": "rl.launch.sft (bazel run //rl/launch:sft)", "dpo": "rl.launch.dpo (bazel run //rl/launch:dpo)"}


@dataclass
class SupervisedArgs:
    """What `split_overrides` makes of a supervised launcher's arguments."""

    block: Any
    """The typed `sft:` / `dpo:` block."""
    overrides: list[str]
    """The key=value overrides left for `load_config`."""
    config_file: str | None
    """The config file left for `load_config`: a temporary copy without the block when the file had one."""
    notes: list[str] = field(default_factory=list)
    """What the dialect tables did (aliases, differing meanings, keys with no effect), to print at start."""


def split_overrides(section: str, overrides: Sequence[str], config_file: str | None) -> SupervisedArgs:
    """The `section` block out of the config file and the overrides (the overrides win), checked; raises
    ConfigError naming every problem."""
    from rl.core.config.dialects.nemo_files import read_config_file

    problems, report = Problems(), Report()
    values: dict[str, Any] = {}
    rest: list[str] = []
    if config_file is not None:
        tree = read_config_file(os.path.expanduser(config_file))
        if isinstance(tree, dict) and any(name in tree for name in BLOCKS):
            for other in BLOCKS:
                block = tree.pop(other, None)
                if other != section:
                    if block is not None:
                        problems.add(other, _other_block(other, section))
                    continue
                if block is not None and not isinstance(block, dict):
                    problems.add(section, f"expected a mapping of keys, got {describe_value(block)}")
                    continue
                for key, value in (block or {}).items():
                    _place(section, key, value, False, values, tree, problems, report)
            handle, config_file = tempfile.mkstemp(suffix=".yaml", prefix=f"{section}-config-")
            with os.fdopen(handle, "w") as f:
                f.write(dump_yaml(tree))
    for item in overrides:
        key, sep, text = item.partition("=")
        head, _, name = key.strip().partition(".")
        if sep and head in BLOCKS and head != section:
            problems.add(key.strip(), _other_block(head, section))
        elif sep and head == section and name:
            _place(section, name, text, True, values, rest, problems, report)
        else:
            rest.append(item)
    block = _block(section, values, problems)
    problems.raise_if_any()
    return SupervisedArgs(block, rest, config_file, report.messages())


def _other_block(other: str, section: str) -> str:
    return (f"is the block of {LAUNCHERS[other]}, and this is {LAUNCHERS[section]}; remove it, or run "
            f"{LAUNCHERS[other].split(' ')[0]}")


def _place(section: str, key: str, value: Any, raw: bool, values: dict, rest: Any, problems: Problems,
           report: Report) -> None:
    """One key of the block: ours, or a dialect's (aliased, accepted with no effect, or refused), or unknown.
    `rest` is the override list (for raw command-line values) or the file's remaining tree."""
    cls, dialects = BLOCKS[section]
    fields = _fields(cls)
    full = f"{section}.{key}"
    if key in fields:
        values[key] = _value(full, value, raw, fields[key], problems)
        return
    for dialect, table in dialects:
        entry = table.get(key)
        if entry is None:
            continue
        if isinstance(entry, Alias):
            if entry.convert is not None:
                try:
                    value, raw = entry.convert(_value(full, value, raw, Any, problems)), False
                except (TypeError, ValueError) as error:
                    problems.add(full, f"{value!r} cannot be read as {entry.target} ({error})")
                    return
            report.aliases.append((full, entry.target, dialect))
            if entry.differs:
                report.differs.append(f"{full} ({dialect}): {entry.differs}")
            target = entry.target
            if target.startswith(section + "."):
                name = target[len(section) + 1:]
                values[name] = _value(target, value, raw, fields[name], problems)
            elif raw:
                rest.append(f"{target}={value}")
            else:
                _nest(rest, target, value)
        elif isinstance(entry, Inert):
            parsed = _value(full, value, raw, Any, problems)
            if entry.accepts(parsed):
                report.inert.append((full, entry.why))
            else:
                problems.add(full, f"is {parsed!r}, which asks for {entry.feature}: not available here; {entry.fix}")
        elif isinstance(entry, Refused):
            problems.add(full, f"asks for {entry.feature}: not available here; {entry.fix}")
        return
    names = [*fields, *(name for _, table in dialects for name in table)]
    problems.add(full, f"unknown key{did_you_mean(full, [f'{section}.{name}' for name in names])}; valid keys "
                       f"under {section}: {', '.join(fields)}")


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _value(key: str, value: Any, raw: bool, tp: Any, problems: Problems) -> Any:
    """A command-line text read for the key's type as the loader reads it (`parse_value`); file values as given."""
    if not raw:
        return value
    ok, parsed = parse_value(key, value, Node(Kind.LEAF, tp), problems)
    return parsed if ok else None


def _nest(tree: dict, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for name in parents:
        tree = tree.setdefault(name, {})
    tree[last] = value


def _block(section: str, values: dict[str, Any], problems: Problems) -> Any:
    """The typed block (types checked by the loader's `build`, naming the key), then its values' checks."""
    cls, _ = BLOCKS[section]
    before = len(problems.lines)
    defaults = dataclasses.asdict(cls())
    block = build(cls, {**defaults, **values}, f"{section}.", problems)
    if block is None or len(problems.lines) > before:
        return None
    if block.max_length < 2:
        problems.add(f"{section}.max_length", f"must be >= 2, got {block.max_length}")
    if section == "sft" and block.loss_reduction not in LOSS_REDUCTIONS:
        problems.add("sft.loss_reduction", f"{block.loss_reduction!r} is not one of {', '.join(LOSS_REDUCTIONS)}")
    if section == "dpo":
        if block.loss_type not in DPO_LOSS_TYPES:
            problems.add("dpo.loss_type", f"{block.loss_type!r} is not one of {', '.join(DPO_LOSS_TYPES)}")
        if not block.beta > 0:
            problems.add("dpo.beta", f"must be > 0, got {block.beta}")
        for name in ("preference_loss_weight", "sft_loss_weight"):
            if getattr(block, name) < 0:
                problems.add(f"dpo.{name}", f"must be >= 0, got {getattr(block, name)}")
    return block


def supervised_config_dict(cfg, section: str, block: Any) -> dict[str, Any]:
    """The run's whole config as plain data: the loader's keys and the block."""
    from rl.core.config.loader import config_to_dict

    return {**config_to_dict(cfg), section: dataclasses.asdict(block)}


def save_supervised_config(cfg, section: str, block: Any, path: str) -> None:
    """The run's config.yaml, atomically: `--config=path` with the same launcher runs the same job."""
    write_atomic(path, dump_yaml(supervised_config_dict(cfg, section, block)))

