"""The selected strategy's checks, and no other strategy's knobs set.

A knob of a strategy that is not selected would silently do nothing, so it is an error: a value that differs from
its block's default in a block the selected strategy does not own. Then the selected strategy checks its own blocks
and refuses what it does not implement (`StrategyConfig.check`); a Ulysses `sequence_parallel_size` > 1 under a
strategy without it is refused with the strategy's hint.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rl.core.config import strategies
from rl.core.config.errors import Problems
from rl.core.config.schema import Config


def _misplaced(problems: Problems, key: str, value: Any, owners: str, strategy: strategies.StrategyConfig) -> None:
    own = ", ".join(strategy.blocks) or "no block of its own"
    problems.add(
        key,
        f"is set to {value!r}, which only applies to trainer.strategy={owners}, but trainer.strategy is "
        f"{strategy.name}, where it would do nothing; remove it (the {strategy.name} knobs are in {own}) or set "
        f"trainer.strategy={owners}",
    )


def check_strategy(cfg: Config, problems: Problems) -> None:
    strategy = strategies.selected(cfg)
    if strategy is None:  # check_strategy_name reports it
        return
    for key, block in strategies.block_types().items():
        if key in strategy.blocks:
            continue
        defaults = block()
        for field in dataclasses.fields(block):
            value = getattr(cfg.blocks[key], field.name)
            if value != getattr(defaults, field.name):
                _misplaced(problems, f"{key}.{field.name}", value, " or ".join(strategies.owners(key)), strategy)
    size = cfg.trainer.policy.sequence_parallel_size
    if size > 1 and not strategy.ulysses:
        with_ulysses = [name for name in strategies.STRATEGIES if strategies.STRATEGIES.get(name).ulysses]
        problems.add(
            "trainer.policy.sequence_parallel_size",
            f"is {size}, but the {strategy.name} backend does not implement Ulysses sequence parallelism (every "
            f"rank would train whole sequences); use trainer.strategy={' or '.join(with_ulysses)}, or set it to "
            f"1{strategy.ulysses_hint}",
        )
    lora = cfg.trainer.policy.model.lora
    if lora.rank > 0 and not strategy.lora:
        with_lora = [name for name in strategies.STRATEGIES if strategies.STRATEGIES.get(name).lora]
        problems.add("trainer.policy.model.lora.rank",
                     f"is {lora.rank}, but the {strategy.name} backend does not train LoRA adapters yet; use "
                     f"trainer.strategy={' or '.join(with_lora) or '(none yet)'}, or set it to 0")
    strategy.check(cfg, problems)
