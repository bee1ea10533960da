"""Other projects' config keys, read as ours: one alias table per dialect (SkyRL's 2025 and 2026 spellings, NeMo RL),
applied when the config loads. Each alias maps a key to ours with the same meaning; keys that differ a little are
accepted and the difference printed; keys with no effect here are listed; keys asking for a feature this project
does not have are refused, naming it. The rest of the code sees only our keys (`config.yaml` in the run directory
holds them).

`entries.py` has the kinds of entries, `skyrl.py` and `nemo.py` the tables, `*_rules.py` the keys that depend on
other keys or on their value, `apply.py` the order they are applied in, `nemo_files.py` NeMo RL's files
(`defaults:` inheritance, `${...}` interpolation) and `suggest.py` the suggestions for unknown keys.
"""

from __future__ import annotations

from rl.core.config.dialects import nemo, nemo_optimizer, nemo_rules, nemo_run_rules, skyrl, skyrl_rules
from rl.core.config.dialects.apply import Dialect, Item, Report, translate

SKYRL = Dialect("SkyRL", skyrl.table, lambda: skyrl.SWITCHES, skyrl_rules.RULES)
NEMO = Dialect(
    "NeMo RL",
    nemo.table,
    nemo.switches,
    (nemo_rules.strategy_switches, nemo_optimizer.optimizer, *nemo_rules.RULES, *nemo_run_rules.RULES),
)
DIALECTS = (SKYRL, NEMO)

__all__ = ["DIALECTS", "NEMO", "SKYRL", "Dialect", "Item", "Report", "translate"]
