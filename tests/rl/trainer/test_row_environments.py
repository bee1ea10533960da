"""A data row's own env_class (SkyRL's per-row column) in this run: it picks the row's environment in a multi-turn
run; a single-turn run accepts only SkyRL-gym's `gsm8k` graded by gsm8k_skyrl; anything else is refused naming the
file and row, with the fix."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import load_config
from rl.core.data import DataError, load_prompt_dataset
from rl.trainer.multi_turn.row_environments import env_class_check


def skyrl_parquet(path, env_classes):
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"q{i}"}], "env_class": name,
             "reward_spec": {"method": "rule", "ground_truth": str(i)}, "extra_info": {"index": i}}
            for i, name in enumerate(env_classes)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def load(path, overrides):
    return load_prompt_dataset([path], env_class_check=env_class_check(load_config(overrides)))


def test_single_turn_runs_take_gsm8k_rows_only_with_its_grading(tmp_path):
    path = skyrl_parquet(tmp_path / "train.parquet", ["gsm8k", "gsm8k"])
    expected = (rf"{re.escape(str(path))} row 0: env_class 'gsm8k' names an environment, but this run is single-turn "
                r".* data.reward_fn \['gsm8k'\]; set environment.env_class=gsm8k .* or data.reward_fn=gsm8k_skyrl")
    with pytest.raises(DataError, match=expected):
        load(path, [])
    assert [r.env_class for r in load(path, ["data.reward_fn=gsm8k_skyrl"])] == ["gsm8k", "gsm8k"]
    assert len(load(path, ["environment.env_class=gsm8k"])) == 2  # SkyRL's spelling: gsm8k_skyrl, single-turn


def test_multi_turn_runs_take_registered_environments_and_refuse_others(tmp_path):
    good = skyrl_parquet(tmp_path / "good.parquet", ["gsm8k_multi_turn", "gsm8k", None])
    overrides = ["environment.env_class=gsm8k_multi_turn"]
    assert [r.env_class for r in load(good, overrides)] == ["gsm8k_multi_turn", "gsm8k", None]
    bad = skyrl_parquet(tmp_path / "bad.parquet", ["gsm8k_multi_turn", "text2sql"])
    expected = rf"{re.escape(str(bad))} row 1: env_class 'text2sql' is no environment here: unknown environment"
    with pytest.raises(DataError, match=expected):
        load(bad, overrides)
