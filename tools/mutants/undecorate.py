"""Rewrite `@deco(...) def f` as `def f` + `f = deco(...)(f)` at the end of the module, in a copy of the sources.

mutmut leaves decorated functions alone (a decorator runs when the function is defined, and copying one for its
trampoline could register it twice), which would leave out every implementation registered by name: the policy
losses, advantage and KL estimators, loss reductions. A registration applied after the definition is the same
call on the same function (here mutmut's trampoline, which dispatches to the mutant under test), so the copy
behaves as the original. The decorator lines become blank lines, so every line keeps its number; only top-level
functions whose decorators are all calls (`@REGISTRY.register("name")`) are rewritten.

Usage: undecorate.py FILE.py... (rewritten in place; run on the mutation work copy only, never on the repository).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def undecorate(source: str) -> str:
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    registrations = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not node.decorator_list:
            continue
        if not all(isinstance(d, ast.Call) for d in node.decorator_list):
            continue
        applied = node.name
        for decorator in reversed(node.decorator_list):  # the decorator nearest the def applies first
            applied = f"{ast.get_source_segment(source, decorator)}({applied})"
        registrations.append(f"{node.name} = {applied}\n")
        for decorator in node.decorator_list:
            for n in range(decorator.lineno - 1, decorator.end_lineno):
                lines[n] = "\n"
    if not registrations:
        return source
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return "".join(lines) + "\n\n" + "".join(registrations)


def main(paths: list[str]) -> int:
    for name in paths:
        path = Path(name)
        source = path.read_text()
        rewritten = undecorate(source)
        if rewritten != source:
            path.write_text(rewritten)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
