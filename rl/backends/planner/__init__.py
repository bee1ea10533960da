"""The memory planner: per-GPU bytes of a training layout before anything starts, from the config and the model's
config.json. Pure: documented formulas (terms.py, state.py, estimate.py), no device and no model load.

- shape.py: a model's shape and parameter counts from config.json.
- terms.py: the formulas, each with its source; state.py: weights, gradients and optimizer state per strategy.
- inputs.py: what the planner reads of a config; layout.py: a candidate layout and the knobs it sets.
- estimate.py: one layout's terms, phases and peak; candidates.py: the layouts of each strategy, cheapest first.
- auto.py: `trainer.strategy=auto` (the decision guide, then the cheapest layout that fits).
- table.py: the table `rl/launch/plan` prints.
"""

from rl.backends.planner.auto import Choice, choose, guide, resolve_tree
from rl.backends.planner.candidates import STRATEGY_ORDER, configured, plan
from rl.backends.planner.estimate import TERMS, Estimate, estimate
from rl.backends.planner.inputs import EngineInputs, PlanInputs, inputs_from_config
from rl.backends.planner.layout import Knobs, Layout, knobs_for
from rl.backends.planner.shape import ModelShape, ShapeError, shape_from_config
from rl.backends.planner.table import render
from rl.core.config.strategies import AUTO

__all__ = [
    "AUTO",
    "STRATEGY_ORDER",
    "TERMS",
    "Choice",
    "EngineInputs",
    "Estimate",
    "Knobs",
    "Layout",
    "ModelShape",
    "PlanInputs",
    "ShapeError",
    "choose",
    "configured",
    "estimate",
    "guide",
    "inputs_from_config",
    "knobs_for",
    "plan",
    "render",
    "resolve_tree",
    "shape_from_config",
]
