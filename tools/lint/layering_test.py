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


# rl/trainer's packages from the top down (rl/trainer/__init__.py): a module imports from its own package or from
# a package below it, never above. "" is rl/trainer's own folder: the run and its loop.
TRAINER_LAYERS = ("supervised", "", "preflight", "multi_turn", "rollout", "workers", "rewards", "state")


def trainer_layer(module: str) -> int | None:
    """The layer of an rl.trainer module (its index in TRAINER_LAYERS), None outside rl.trainer."""
    parts = module.split(".")
    if parts[:2] != ["rl", "trainer"]:
        return None
    package = parts[2] if len(parts) >= 3 and parts[2] in TRAINER_LAYERS else ""
    return TRAINER_LAYERS.index(package)


def trainer_back_imports(modules: dict[str, set[str]]) -> list[str]:
    """`importer imports imported` for each import against TRAINER_LAYERS; `modules`: module -> what it imports."""
    wrong = []
    for name, imported in sorted(modules.items()):
        own = trainer_layer(name)
        for module in sorted(imported):
            layer = trainer_layer(module)
            if own is not None and layer is not None and layer < own and module.count(".") >= 2:
                wrong.append(f"{name} ({TRAINER_LAYERS[own] or 'rl/trainer'}) imports {module} "
                             f"({TRAINER_LAYERS[layer] or 'rl/trainer'}, above it)")
    return wrong


def _trainer_modules() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in _files("rl/trainer", (".py",))}
    return {name: {m for m in imported_modules(path) if m in modules and m != name}
            for name, path in modules.items()}


def test_trainer_packages_point_one_way():
    wrong = trainer_back_imports(_trainer_modules())
    assert not wrong, "rl/trainer's packages import up (rl/trainer/__init__.py gives the order):\n" + "\n".join(wrong)


def test_a_planted_back_import_is_caught():
    modules = {"rl.trainer.state.metrics": {"rl.trainer.rewards.rewarding"},
               "rl.trainer.loop": {"rl.trainer.state.metrics", "rl.trainer.rollout.engines"},
               "rl.trainer.rollout.engines": {"rl.trainer.rollout.sampling"}}
    assert trainer_back_imports(modules) == [
        "rl.trainer.state.metrics (state) imports rl.trainer.rewards.rewarding (rewards, above it)"]
    assert trainer_back_imports({"rl.trainer.workers.placement": {"rl.trainer.loop"}}) == [
        "rl.trainer.workers.placement (workers) imports rl.trainer.loop (rl/trainer, above it)"]


def test_no_import_cycle_among_trainer_modules():
    cycle = find_cycle(_trainer_modules())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_trainer_folders_stay_small():
    """No module over 450 lines, no folder of more than 12 modules (its __init__.py aside)."""
    big, folders = [], {}
    for path in _files("rl/trainer", (".py",)):
        with open(path) as f:
            lines = len(f.read().splitlines())
        if lines > 450:
            big.append(f"{os.path.relpath(path, _root())}: {lines} lines")
        if not path.endswith("__init__.py"):
            folders[os.path.dirname(path)] = folders.get(os.path.dirname(path), 0) + 1
    crowded = [f"{os.path.relpath(d, _root())}: {n} modules" for d, n in folders.items() if n > 12]
    assert not big and not crowded, "\n".join(big + crowded)
