"""`trainer.strategy=auto`: the decision guide as code, then the planner's cheapest layout that fits.

The guide (the README's "Choosing a strategy"): a mixture-of-experts model -> megatron (expert parallelism); more
than 30B parameters -> megatron; fewer than 14B -> fsdp2; in between either, whichever of fsdp2 and megatron has
the cheaper layout that fits. Within the guide's strategies the first layout predicted to fit, in their cost order
(`candidates`), is chosen; when none fits there, the cheapest that fits under any strategy; when nothing fits, the
guide's layout with the smallest peak (preflight then refuses it, with the numbers). Without a known GPU memory
(`trainer.placement.gpu_memory_gb` null and no GPU here) the guide's strategy is taken with the config's layout.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl.backends.planner.candidates import STRATEGY_ORDER, plan
from rl.backends.planner.estimate import Estimate
from rl.backends.planner.inputs import PlanInputs
from rl.backends.planner.layout import Layout
from rl.backends.planner.shape import ModelShape
from rl.backends.planner.terms import GIB

MEGATRON_ABOVE = 30e9
FSDP2_BELOW = 14e9


@dataclass(frozen=True)
class Choice:
    layout: Layout
    rule: str
    """The guide's rule that applied."""
    reason: str
    """One line: what was chosen and why (printed by the launcher, recorded as trainer.auto_choice)."""
    estimate: Estimate | None = None


def guide(shape: ModelShape) -> tuple[tuple[str, ...], str]:
    """(strategies to consider, in order; the rule that picked them)."""
    total = shape.total_params()
    size = f"{total / 1e9:.2f}B" if total >= 1e9 else f"{total / 1e6:.1f}M" if total >= 1e6 else f"{total:,}"
    if shape.vision:
        return ("fsdp2",), f"a vision-language model ({size} parameters in its language half) -> fsdp2 (megatron " \
                           "takes none)"
    if shape.is_moe:
        return ("megatron",), f"mixture of experts ({shape.experts} experts) -> megatron (expert parallelism)"
    if total > MEGATRON_ABOVE:
        return ("megatron",), f"{size} parameters > 30B -> megatron"
    if total < FSDP2_BELOW:
        return ("fsdp2",), f"{size} parameters < 14B -> fsdp2"
    return ("fsdp2", "megatron"), f"{size} parameters, 14B-30B -> fsdp2 or megatron, the cheaper that fits"


def _describe(estimate: Estimate, gpu_bytes: float) -> str:
    return (f"{estimate.label}: predicted peak {estimate.peak / GIB:.1f} of {gpu_bytes / GIB:.1f} GiB per GPU "
            f"({estimate.phase})")


def choose(cfg, inputs: PlanInputs) -> Choice:
    """The layout `trainer.strategy=auto` runs (see the module docstring)."""
    strategies, rule = guide(inputs.shape)
    gpu = inputs.gpu_bytes
    if gpu is None:
        return Choice(Layout(strategies[0]), rule, f"{strategies[0]} (rule: {rule}); GPU memory unknown, so the "
                      "layout is the config's (set trainer.placement.gpu_memory_gb to let the planner size it)")
    rows = [(c, e) for c, e in plan(cfg, inputs) if c.auto and not e.excluded]
    preferred = [e for c, e in rows if e.layout.strategy in strategies]
    fitting = [e for e in preferred if e.fits(gpu)]
    if fitting:
        best = fitting[0] if len(strategies) == 1 else min(fitting, key=lambda e: _cost_rank(e, preferred))
        return Choice(best.layout, rule, f"{_describe(best, gpu)}; rule: {rule}; cheapest layout predicted to fit",
                      best)
    anywhere = [e for _, e in rows if e.fits(gpu)]
    smallest = min(preferred, key=lambda e: e.peak) if preferred else None
    if anywhere:
        best = anywhere[0]
        why = f"no {'/'.join(strategies)} layout is predicted to fit"
        if smallest is not None:
            why += f" (smallest: {_describe(smallest, gpu)})"
        return Choice(best.layout, rule, f"{_describe(best, gpu)}; rule: {rule}, but {why}", best)
    if smallest is None:
        return Choice(Layout(strategies[0]), rule, f"{strategies[0]} (rule: {rule}); no layout of it can run here")
    engine = f"; {smallest.engine_problem}" if smallest.engine_problem else ""
    return Choice(smallest.layout, rule, f"{_describe(smallest, gpu)}; rule: {rule}; no layout is predicted to fit "
                  f"{inputs.world} GPUs of {gpu / GIB:.1f} GiB, this is the smallest{engine}", smallest)


def _cost_rank(estimate: Estimate, ordered: list[Estimate]) -> tuple[int, int]:
    """Between strategies: the position in its own strategy's cost order, then the guide's order."""
    own = [e for e in ordered if e.layout.strategy == estimate.layout.strategy]
    return own.index(estimate), STRATEGY_ORDER.index(estimate.layout.strategy)


def resolve_tree(tree: dict[str, Any], build: Callable[[dict], Any],
                 inputs_of: Callable[[Any], PlanInputs | None]) -> tuple[dict[str, Any], Choice | None]:
    """The keys `trainer.strategy=auto` sets in a layered config tree: trainer.strategy, the chosen layout's keys
    and trainer.auto_choice. `build` makes a typed Config of a tree (raising on type errors), `inputs_of` the
    PlanInputs of a Config (None when the model's config.json cannot be read). A tree that does not build gets
    fsdp2, so that its own problems are what the loader reports."""
    trial = copy.deepcopy(tree)
    trial.setdefault("trainer", {})["strategy"] = "fsdp2"
    try:
        cfg = build(trial)
        inputs = inputs_of(cfg)
    except ValueError:
        return {"trainer.strategy": "fsdp2"}, None
    if inputs is None:
        choice = Choice(Layout("fsdp2"), "model size unknown",
                        "fsdp2 (rule: the model's config.json could not be read, so its size is unknown; the "
                        "default strategy)")
    else:
        choice = choose(cfg, inputs)
    return {"trainer.strategy": choice.layout.strategy, **choice.layout.settings,
            "trainer.auto_choice": choice.reason}, choice
