"""The table of tools/bound_margins.sh: per comparing line, the largest |gap| / bound under each kernel path.

Usage: python3 tools/suite/bound_margins.py FILE.jsonl ...   (lines written by tests/testing/margins.py)
       python3 tools/suite/bound_margins.py --collect bazel-testlogs   (prints the lines of every target's outputs)
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import sys
import zipfile
from collections import defaultdict

EMPIRICAL = re.compile(r"\b(network_rtol|logprob_gap|gradient_gap|trained_model_logprob_gap)\(")
"""The bounds of tests/testing/tolerances.py that are empirical (a heuristic with a measured margin)."""


@functools.cache
def _functions(path: str) -> list[tuple[int, int, str, str]]:
    """(first line, last line, name, source) of every function in the file at `path`; none where it is unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return []
    return [(node.lineno, node.end_lineno, node.name, ast.get_source_segment(text, node) or "")
            for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def _uses_network_bound(source: str, by_name: dict[str, str], depth: int = 3) -> bool:
    """The source builds a bound from a network bound, itself or through the file's own helpers it calls."""
    if EMPIRICAL.search(source):
        return True
    called = set(re.findall(r"\b(\w+)\(", source)) & by_name.keys()
    return depth > 0 and any(_uses_network_bound(by_name[name], by_name, depth - 1) for name in called)


def bound_kind(site: str) -> str:
    """"empirical" when the function making the comparison builds its bound from a network bound (itself or through
    a helper of its file), else "derived"."""
    path, _, line = site.rpartition(":")
    functions = _functions(path)
    enclosing = [f for f in functions if f[0] <= int(line) <= f[1]]
    if not enclosing:
        return "?"
    innermost = max(enclosing, key=lambda f: f[0])
    by_name = {name: source for _, _, name, source in functions if name != innermost[2]}
    return "empirical" if _uses_network_bound(innermost[3], by_name) else "derived"


def table(lines: list[str]) -> str:
    worst: dict[str, dict[str, float]] = defaultdict(dict)
    messages: dict[str, str] = {}
    for line in lines:
        entry = json.loads(line)
        site, path = entry["site"], entry["path"]
        worst[site][path] = max(worst[site].get(path, 0.0), entry["ratio"])
        messages.setdefault(site, entry["msg"])
    paths = sorted({path for by_path in worst.values() for path in by_path})
    rows = sorted(worst.items(), key=lambda item: -max(item[1].values()))
    out = ["| comparing line | bound | " + " | ".join(paths) + " | margin |", "|---" * (len(paths) + 3) + "|"]
    for site, by_path in rows:
        top = max(by_path.values())
        margin = "none" if top >= 1 else ("exact" if top == 0 else f"{1 / top:.3g}x")
        cells = " | ".join(f"{by_path[path]:.3g}" if path in by_path else "-" for path in paths)
        out.append(f"| `{site}` {messages[site]} | {bound_kind(site)} | {cells} | {margin} |")
    return "\n".join(out)


def collect(testlogs: str) -> None:
    """Bazel zips each target's undeclared outputs into test.outputs/outputs.zip."""
    for folder, _, names in os.walk(testlogs, followlinks=True):
        if os.path.basename(folder) == "test.outputs" and "outputs.zip" in names:
            with zipfile.ZipFile(os.path.join(folder, "outputs.zip")) as archive:
                if "bound_margins.jsonl" in archive.namelist():
                    sys.stdout.write(archive.read("bound_margins.jsonl").decode())


def main(files: list[str]) -> None:
    if files[:1] == ["--collect"]:
        collect(files[1])
        return
    lines = []
    for name in files:
        with open(name, encoding="utf-8") as f:
            lines.extend(line for line in f if line.strip())
    if not lines:
        sys.exit("bound_margins: no comparisons recorded (were the targets run with RLPOST_BOUND_MARGINS=1?)")
    print(table(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
