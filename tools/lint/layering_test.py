"""Layers point one way: rl/launch -> rl/trainer (the driver) -> rl/backends -> rl/kernels and rl/core (pure); the
tasks (rl/tasks: datasets, rewards, the embedded job) sit beside the backends, under the driver and above rl/core.

Checks the real source tree (found through the pyproject.toml data dependency, as lint_test does) for imports, and
the BUILD files for dependencies, that point up a layer, and for import cycles among the backend modules. Imports
under `if TYPE_CHECKING:` are annotations only and do not count.
"""

import ast
import os
import re

import pytest

# Which packages each layer may not reach, and why.
FORBIDDEN = {
    "rl/core": ("rl.backends", "rl.trainer", "rl.launch", "rl.kernels", "rl.tasks"),
    "rl/kernels": ("rl.backends", "rl.trainer", "rl.launch"),
    "rl/backends": ("rl.trainer", "rl.launch"),
    "rl/trainer": ("rl.launch",),
    "rl/tasks": ("rl.trainer", "rl.launch"),
}


def _root() -> str:
    return os.path.dirname(os.path.realpath("pyproject.toml"))


def _files(top: str, names: tuple[str, ...]) -> list[str]:
    found = []
    for dirpath, _dirnames, filenames in os.walk(os.path.join(_root(), top)):
        found += [os.path.join(dirpath, f) for f in filenames if f.endswith(names)]
    return sorted(found)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_modules(path: str) -> set[str]:
    """Every module `path` imports at run time (module level or inside functions), as dotted names."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    with open(path) as f:
        visit(ast.parse(f.read(), path))
    return found


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, _root())[: -len(".py")]
    return rel.replace(os.sep, ".").removesuffix(".__init__")


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_python_imports_point_down(layer):
    wrong = []
    for path in _files(layer, (".py",)):
        for module in sorted(imported_modules(path)):
            if any(module == up or module.startswith(up + ".") for up in FORBIDDEN[layer]):
                wrong.append(f"{os.path.relpath(path, _root())} imports {module}")
    assert not wrong, f"{layer} may not import {', '.join(FORBIDDEN[layer])}:\n" + "\n".join(sorted(set(wrong)))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_bazel_deps_point_down(layer):
    labels = tuple("//" + up.replace(".", "/") for up in FORBIDDEN[layer])
    wrong = []
    for path in _files(layer, ("BUILD.bazel", "BUILD")):
        with open(path) as f:
            for label in re.findall(r'"(//[^"]+)"', f.read()):
                if any(label == up or label.startswith((up + ":", up + "/")) for up in labels):
                    wrong.append(f"{os.path.relpath(path, _root())} depends on {label}")
    assert not wrong, "\n".join(wrong)


def _code_strings(path: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant in `path` that is not documentation (a string standing alone as a
    statement: module, class, function and attribute docstrings)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_strategy_is_named_outside_the_backends_and_the_launcher():
    """The driver and the pure layer reach strategies through the registry, never by name (messages included)."""
    from rl.backends.registry import STRATEGIES

    names = STRATEGIES.names()
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    wrong = []
    for top in ("rl/core", "rl/trainer", "rl/kernels", "rl/tasks"):
        for path in _files(top, (".py",)):
            wrong += [f"{os.path.relpath(path, _root())}:{line}: {text!r}" for line, text in _code_strings(path)
                      if pattern.search(text)]
    assert not wrong, "strategy names in code outside rl/backends and rl/launch:\n" + "\n".join(wrong)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (module -> modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := walk(start)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_among_backend_modules():
    paths = _files("rl/backends", (".py",))
    modules = {_module_name(p): p for p in paths}
    graph = {name: {m for m in imported_modules(path) if m in modules and m != name}
             for name, path in modules.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
