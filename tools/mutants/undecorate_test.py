"""undecorate.py keeps every line where it was and registers the same implementations as the decorators did:
checked on a small module and on every module of the packages tools/mutants.sh mutates."""

import importlib
import sys
import types
from pathlib import Path

import pytest

from tools.mutants.undecorate import undecorate

PACKAGES = ("rl/core/algorithms", "rl/core/packing")

SMALL = '''from rl.core.registry import Registry

TABLE = Registry("thing")


@TABLE.register("one")
def one(x):
    return x + 1


@TABLE.register(
    "two",
)
def two(x):
    return x + 2


def plain(x):
    return x
'''


def load(source: str, name: str) -> types.ModuleType:
    """`source` run as a fresh module `name` (in sys.modules while it runs: dataclasses look their module up)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(source, name, "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module


def test_a_small_module():
    rewritten = undecorate(SMALL)
    lines, original = rewritten.splitlines(), SMALL.splitlines()
    assert [n for n, line in enumerate(original) if line.startswith("def ")] == \
           [n for n, line in enumerate(lines) if line.startswith("def ")]
    assert rewritten.endswith('\n\none = TABLE.register("one")(one)\ntwo = TABLE.register(\n    "two",\n)(two)\n')
    module = load(rewritten, "small_undecorated")
    assert module.TABLE.names() == ["one", "two"]
    assert module.TABLE.get("one") is module.one and module.TABLE.get("two")(1) == 3
    assert undecorate("def f():\n    return 1\n") == "def f():\n    return 1\n"


@pytest.mark.parametrize("path", sorted(str(p) for package in PACKAGES for p in Path(package).glob("*.py")))
def test_the_mutated_packages(path):
    source = Path(path).read_text()
    rewritten = undecorate(source)
    original_lines, lines = source.splitlines(), rewritten.splitlines()
    for n, line in enumerate(original_lines):  # each line kept, or blanked where it was a decorator
        assert lines[n] in (line, ""), f"{path}:{n + 1}"
    if rewritten == source:
        return
    name = path[:-3].replace("/", ".")
    original = importlib.import_module(name)
    copy = load(rewritten, name + "_undecorated")
    registries = [k for k, v in vars(original).items() if type(v).__name__ == "Registry" and v.names()]
    assert registries, f"{path} was rewritten but defines no registry"
    for key in registries:
        assert getattr(copy, key).names() == getattr(original, key).names()
        for entry in getattr(original, key):
            got, want = getattr(copy, key).get(entry), getattr(original, key).get(entry)
            assert getattr(got, "__name__", getattr(got, "name", None)) == \
                   getattr(want, "__name__", getattr(want, "name", None))
