"""The `sft:` and `dpo:` blocks of the supervised and preference launchers (`rl.launch.sft`, `rl.launch.dpo`).

Everything else (model, strategy and its block, batch sizes, optimizer, checkpoints, exports, data files) is the
RL config's (`load_config`): `split_overrides` takes the `sft.*` / `dpo.*` keys out of the command line and the
config file, turns SkyRL's SFT names and NeMo RL's `dpo:` names into ours (`SKYRL_SFT_ALIASES`,
`NEMO_DPO_ALIASES`), and leaves the rest to the loader.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from rl.core.config.errors import ConfigError


@dataclass(frozen=True)
class SftConfig:
    """The `sft:` block."""

    messages_key: str = "messages"
    """Column of chat-format rows: a list of {role, content} messages (SkyRL's `messages_key`)."""
    prompt_key: str = "prompt"
    """Column of the prompt (text, or a list of messages) where rows have no `messages_key` column."""
    response_key: str = "response"
    """Column of the assistant's response beside `prompt_key`."""
    max_length: int = 2048
    """Longest example in tokens, chat template included (SkyRL's `max_length`)."""
    truncate: bool = False
    """A longer example is refused (false) or cut to `max_length` (true)."""
    loss_reduction: str = "token_mean"
    """How token losses are reduced over the mini-batch: token_mean, sequence_mean."""


@dataclass(frozen=True)
class DpoConfig:
    """The `dpo:` block."""

    beta: float = 0.1
    """The DPO temperature beta (NeMo RL's `reference_policy_kl_penalty`)."""
    loss_type: str = "sigmoid"
    """sigmoid (DPO) or ipo."""
    sft_loss_weight: float = 0.0
    """Weight of the chosen response's mean token NLL added to the preference loss (NeMo RL's key)."""
    preference_average_log_probs: bool = False
    """Log-ratios as means over the response's tokens instead of sums (NeMo RL's key)."""
    prompt_key: str = "prompt"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    max_length: int = 2048
    """Longest prompt + response in tokens."""
    truncate: bool = False
    """A longer example is refused (false) or cut to `max_length` (true)."""


# SkyRL's SFTConfig names (top level there) -> where they live here
SKYRL_SFT_ALIASES = {"num_steps": "trainer.max_steps", "num_epochs": "trainer.epochs",
                     "batch_size": "trainer.train_batch_size"}
NEMO_DPO_ALIASES = {"reference_policy_kl_penalty": "dpo.beta", "preference_loss": "dpo.loss_type",
                    "max_num_steps": "trainer.max_steps", "max_num_epochs": "trainer.epochs",
                    "val_period": "trainer.eval_interval", "seed": "trainer.seed"}
NEMO_LOSS_NAMES = {"dpo": "sigmoid"}
BLOCKS = {"sft": (SftConfig, SKYRL_SFT_ALIASES), "dpo": (DpoConfig, NEMO_DPO_ALIASES)}


def _block(section: str, values: dict[str, Any]) -> Any:
    cls, _ = BLOCKS[section]
    known = {f.name: f for f in dataclasses.fields(cls)}
    problems = [f"{section}.{key}: unknown key; known keys: {', '.join(known)}" for key in values if key not in known]
    if problems:
        raise ConfigError(problems)
    if section == "dpo" and "loss_type" in values:
        values["loss_type"] = NEMO_LOSS_NAMES.get(values["loss_type"], values["loss_type"])
    block = cls(**values)
    if section == "dpo" and block.loss_type not in ("sigmoid", "ipo"):
        raise ConfigError([f"dpo.loss_type: {block.loss_type!r} is not one of sigmoid, ipo"])
    if section == "dpo" and not block.beta > 0:
        raise ConfigError([f"dpo.beta: must be > 0, got {block.beta}"])
    if block.max_length < 2:
        raise ConfigError([f"{section}.max_length: must be >= 2, got {block.max_length}"])
    if section == "sft" and block.loss_reduction not in ("token_mean", "sequence_mean"):
        raise ConfigError([f"sft.loss_reduction: {block.loss_reduction!r} is not one of token_mean, sequence_mean"])
    return block


def split_overrides(section: str, overrides: Sequence[str], config_file: str | None
                    ) -> tuple[Any, list[str], str | None]:
    """(the typed `section` block, the overrides left for `load_config`, the config file left for it: a temporary
    copy without the block when the file had one)."""
    values: dict[str, Any] = {}
    rest: list[str] = []
    _, aliases = BLOCKS[section]
    if config_file is not None:
        with open(os.path.expanduser(config_file)) as f:
            tree = yaml.safe_load(f) or {}
        if isinstance(tree, dict) and section in tree:
            for key, value in (tree.pop(section) or {}).items():
                _place(section, key, value, aliases, values, rest)
            handle, config_file = tempfile.mkstemp(suffix=".yaml", prefix=f"{section}-config-")
            with os.fdopen(handle, "w") as f:
                yaml.safe_dump(tree, f)
    for item in overrides:
        key, sep, text = item.partition("=")
        if sep and key.startswith(f"{section}."):
            _place(section, key[len(section) + 1:], yaml.safe_load(text), aliases, values, rest)
        else:
            rest.append(item)
    return _block(section, values), rest, config_file


def _place(section: str, key: str, value: Any, aliases: dict[str, str], values: dict, rest: list[str]) -> None:
    target = aliases.get(key, f"{section}.{key}")
    if target.startswith(f"{section}."):
        values[target[len(section) + 1:]] = value
    else:
        rest.append(f"{target}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}")
