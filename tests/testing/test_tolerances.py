"""The comparison rule itself: NaN never passes, infinities only where both sides agree, and the margin log that
shows the empirical bounds true (tools/bound_margins.sh) records what was compared, where, and how close it came."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib

import pytest
import torch

from tests.testing.tolerances import assert_within


def _table_module():
    root = pathlib.Path(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", ""))
    path = next(p for p in (root / "tools/suite/bound_margins.py", pathlib.Path("tools/suite/bound_margins.py"))
                if p.is_file())
    spec = importlib.util.spec_from_file_location("bound_margins", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("got,want", [
    ([1.0, math.nan], [1.0, 2.0]),
    ([1.0, 2.0], [1.0, math.nan]),
    ([math.nan], [math.nan]),
    ([math.inf], [-math.inf]),
    ([math.inf], [1e300]),
])
def test_nan_and_unmatched_infinity_fail(got, want):
    with pytest.raises(AssertionError, match="1 of"):
        assert_within(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64), 1e9, "x")


def test_nan_bound_fails_and_equal_infinities_pass():
    with pytest.raises(AssertionError):
        assert_within(torch.tensor([1.0]), torch.tensor([1.0]), torch.tensor([math.nan]), "nan bound")
    assert_within(torch.tensor([math.inf, -math.inf, 3.0]), torch.tensor([math.inf, -math.inf, 3.5]), 0.5)


def test_just_outside_fails_and_at_the_bound_passes():
    assert_within(torch.tensor([1.25]), torch.tensor([1.0]), 0.25)  # exact in binary: the gap equals the bound
    with pytest.raises(AssertionError, match=r"\|gap\| 0.25 > bound 0.125"):
        assert_within(torch.tensor([1.25, 1.0]), torch.tensor([1.0, 1.0]), 0.125, "edge")


def test_margins_record_the_calling_line_and_the_worst_ratio(tmp_path, monkeypatch):
    log = tmp_path / "margins.jsonl"
    monkeypatch.setenv("RLPOST_BOUND_MARGINS", str(log))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert_within(torch.tensor([1.0, 2.5, 3.0]), torch.tensor([1.5, 2.0, 3.0]), torch.tensor([1.0, 2.0, 1.0]), "a")
    line = test_margins_record_the_calling_line_and_the_worst_ratio.__code__.co_firstlineno + 4
    assert_within(torch.tensor([2.0]), torch.tensor([2.0]), 0.0, "b")
    first, second = (json.loads(text) for text in log.read_text().splitlines())
    assert first == {"site": f"tests/testing/test_tolerances.py:{line}", "msg": "a", "path": "avx2", "ratio": 0.5}
    assert second["ratio"] == 0.0 and second["msg"] == "b"


def test_margin_table_takes_the_worst_per_path_and_sorts_by_it():
    entries = [
        {"site": "t.py:1", "msg": "m", "path": "avx2", "ratio": 0.25},
        {"site": "t.py:1", "msg": "m", "path": "avx2", "ratio": 0.5},
        {"site": "t.py:1", "msg": "m", "path": "default", "ratio": 0.125},
        {"site": "t.py:9", "msg": "n", "path": "default", "ratio": 0.0},
        {"site": "t.py:5", "msg": "o", "path": "default", "ratio": 0.8},
    ]
    rows = _table_module().table([json.dumps(e) for e in entries]).splitlines()
    assert rows[0] == "| comparing line | bound | avx2 | default | margin |"
    assert rows[2:] == [  # t.py cannot be read: the kind of its bounds is unknown
        "| `t.py:5` o | ? | - | 0.8 | 1.25x |",
        "| `t.py:1` m | ? | 0.5 | 0.125 | 2x |",
        "| `t.py:9` n | ? | - | 0 | exact |",
    ]


def test_a_bound_built_from_a_network_bound_is_called_empirical(tmp_path):
    source = tmp_path / "t.py"
    source.write_text("def a(x):\n    assert_within(x, x, logprob_gap(c, x, 4))\n\n\n"
                      "def b(x):\n    assert_within(x, x, reordered_sum_gap(4, x, d))\n\n\n"
                      "def _rtol(c):\n    return network_rtol(c, d)\n\n\n"
                      "def c(x):\n    assert_within(x, x, _rtol(x) * 2)\n")
    module = _table_module()
    assert module.bound_kind(f"{source}:2") == "empirical"
    assert module.bound_kind(f"{source}:6") == "derived"
    assert module.bound_kind(f"{source}:14") == "empirical"  # through the file's own helper
