"""YAML merge keys (`<<: *anchor`, as NeMo RL's distillation_math.yaml writes them) read as PyYAML's safe_load reads
them, while a key written twice in one mapping is still refused."""

import pytest
import yaml

from rl.core.config.yaml_io import parse_text

ANCHORS_AND_MERGES = """
base: &base
  lr: 1.0e-6
  batch: 8
  opts: {a: 1}
policy:
  <<: *base
  batch: 16
teacher: &teacher
  <<: *base
  name: teacher
both:
  <<: [*teacher, {extra: true}]
  lr: 2.0e-6
reused: *teacher
"""


def test_merge_keys_read_as_safe_load_reads_them():
    got = parse_text(ANCHORS_AND_MERGES)
    assert got == yaml.safe_load(ANCHORS_AND_MERGES)
    # Written keys win over merged ones (YAML's merge-key rule), checked by hand as well.
    assert got["policy"] == {"lr": 1.0e-6, "batch": 16, "opts": {"a": 1}}
    assert got["both"]["extra"] is True and got["both"]["lr"] == 2.0e-6 and got["both"]["name"] == "teacher"


def test_a_key_written_twice_is_still_refused_next_to_a_merge():
    text = "base: &base {x: 1}\nmerged:\n  <<: *base\n  y: 2\n  y: 3\n"
    with pytest.raises(yaml.constructor.ConstructorError, match="key 'y' appears twice in one mapping"):
        parse_text(text)


def test_a_written_key_may_override_a_merged_one():
    assert parse_text("base: &base {x: 1}\nmerged:\n  <<: *base\n  x: 2\n")["merged"] == {"x": 2}
