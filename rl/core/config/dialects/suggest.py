"""Suggestions for an unknown key, by meaning first.

1. A key of another project spelled a little differently (`generator.inference_engine.bakend`): the dialect key it
   is close to, with what that key means here.
2. A key of ours spelled a little differently (`trainer.polcy.optimizer_config.lr`): our key, but only when the last
   parts of the two names are close too. A name that merely shares words with one of ours
   (`inference_engine.backend` and `num_inference_engines`, `sampling_params.top_p` and `n_samples_per_prompt`)
   means something else and gets no suggestion; nor do the pairs in FALSE_FRIENDS, whose names are close but
   whose meanings are not.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable

from rl.core.config import strategies
from rl.core.config.dialects import nemo, skyrl
from rl.core.config.dialects.apply import is_ours
from rl.core.config.dialects.entries import Alias, ByRule, Elsewhere, Inert, Refused

LEAF_CUTOFF = 0.75
"""How close the last parts of the names must be (difflib's ratio) for a suggestion of ours."""
FALSE_FRIENDS = frozenset(
    {
        ("eval_batch_size", "train_batch_size"),
        ("eval_temperature", "temperature"),
        ("max_ckpts_to_keep", "ckpt_interval"),
        ("log_path", "export_path"),
        ("max_input_length", "max_prompt_length"),
    }
)
"""(their last part, our last part) pairs with close names and different meanings."""


def _dialect_keys() -> dict[str, tuple[str, object]]:
    """Their exact keys (not ours: a key both projects spell alike is ours) -> (dialect, entry)."""
    return _dialect_keys_with(tuple(strategies.STRATEGIES.names()))


@functools.cache
def _dialect_keys_with(registered: tuple[str, ...]) -> dict[str, tuple[str, object]]:
    """_dialect_keys for one set of registered strategies (their NeMo RL keys are in the table)."""
    found: dict[str, tuple[str, object]] = {}
    for name, table in (("SkyRL", skyrl.table()), ("NeMo RL", nemo.table())):
        for key, entry in table.items():
            if "*" not in key and not is_ours(key):
                found.setdefault(key, (name, entry))
    return found


def _meaning(dialect: str, entry: object) -> str:
    if isinstance(entry, Alias):
        return f"{dialect}'s name for {entry.target}"
    if isinstance(entry, ByRule):
        return f"{dialect}'s key for {entry.meaning}"
    if isinstance(entry, Inert):
        return f"{dialect}'s key, with no effect here at its usual values"
    if isinstance(entry, Refused | Elsewhere):
        return f"{dialect}'s key, not available here"
    return f"{dialect}'s key"


def _leaf(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def suggestion(key: str, ours: Iterable[str]) -> str:
    """` (did you mean 'x'?)`, or ` (did you mean 'x', SkyRL's name for y?)`, or an empty string."""
    theirs = _dialect_keys()
    close = difflib.get_close_matches(key, list(theirs), n=1, cutoff=0.8)
    if close and _leaf_close(key, close[0]):
        dialect, entry = theirs[close[0]]
        return f" (did you mean '{close[0]}', {_meaning(dialect, entry)}?)"
    for candidate in difflib.get_close_matches(key, list(ours), n=3):
        if _leaf_close(key, candidate) and (_leaf(key), _leaf(candidate)) not in FALSE_FRIENDS:
            return f" (did you mean '{candidate}'?)"
    return ""


def _leaf_close(key: str, candidate: str) -> bool:
    a, b = _leaf(key), _leaf(candidate)
    return a == b or difflib.SequenceMatcher(None, a, b).ratio() >= LEAF_CUTOFF
