"""The kill rate and the survivors of a `mutmut run`, read from its work folder (run by tools/mutants.sh).

Usage: report.py --package rl/core/algorithms --equivalents tools/mutants/equivalent.toml [--seconds S]
(in the work folder, with the pinned mutmut importable). Prints the counts, the kill rate, and one line per mutant
that was not killed: `path:line  function  old -> new  mutmut's name` (the changed source lines; `mutmut show NAME`
in the work folder shows the diff). Survivors matching an entry of the equivalents file (same path, function and
mutation) are listed as equivalent, the others as unexplained first. Writes summary.json in the work folder.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tomllib
from pathlib import Path

from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
from mutmut.utils.format_utils import orig_function_and_class_names_from_key

# A test process that times out or dies on a signal under a mutant has told the mutant apart from the original.
KILLED = ("killed", "timeout", "segfault")


def _function_lines(source: str, function: str, class_name: str | None) -> tuple[int, int]:
    """First and last line (1-based, decorators included) of a top-level function or a method."""
    body = ast.parse(source).body
    if class_name is not None:
        body = next(node.body for node in body if isinstance(node, ast.ClassDef) and node.name == class_name)
    node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function)
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return first, node.end_lineno


def _changed(diff: str) -> tuple[list[str], list[str], int]:
    """The removed and added lines of a one-hunk unified diff, and the removal's index in the old text (0-based)."""
    old, new, index, at = [], [], 0, None
    for line in diff.splitlines()[2:]:
        if line.startswith("@@"):
            index = int(line.split()[1].lstrip("-").split(",")[0]) - 1
            continue
        if line.startswith("-"):
            at = index if at is None else at
            old.append(line[1:].strip())
            index += 1
        elif line.startswith("+"):
            at = index if at is None else at
            new.append(line[1:].strip())
        else:
            index += 1
    return old, new, at or 0


def describe(key: str, path: str) -> dict:
    function, class_name = orig_function_and_class_names_from_key(key)
    old, new, at = _changed(get_diff_for_mutant(key, path=path))
    source = Path(path).read_text()
    lines = source.splitlines()
    first, last = _function_lines(source, function, class_name)
    # The diff counts from the function's first line (comments above it included); the changed line is the one in
    # the function with that text nearest to where the diff puts it.
    guess = first + at
    wanted = old[0] if old else None
    hits = [n for n in range(first, last + 1) if wanted is not None and lines[n - 1].strip() == wanted]
    line = min(hits, key=lambda n: abs(n - guess)) if hits else guess
    return {
        "key": key,
        "path": path,
        "line": line,
        "function": function if class_name is None else f"{class_name}.{function}",
        "mutation": f"{' / '.join(old) or '(nothing)'} -> {' / '.join(new) or '(removed)'}",
    }


def load_equivalents(path: Path) -> dict[tuple[str, str, str], str]:
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("equivalent", [])
    return {(e["path"], e["function"], e["mutation"]): e["reason"] for e in entries}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True)
    parser.add_argument("--equivalents", type=Path, required=True)
    parser.add_argument("--seconds", type=float)
    args = parser.parse_args()

    counts: dict[str, int] = {}
    survivors = []
    for meta in sorted(Path("mutants", args.package).rglob("*.py.meta")):
        path = str(meta.relative_to("mutants"))[: -len(".meta")]
        for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            status = status_by_exit_code[code]
            counts[status] = counts.get(status, 0) + 1
            if status not in KILLED:
                survivors.append({**describe(key, path), "status": status})
    total = sum(counts.values())
    if not total:
        print(f"mutants: no mutants in {args.package}", file=sys.stderr)
        return 1
    killed = sum(counts.get(s, 0) for s in KILLED)
    equivalents = load_equivalents(args.equivalents)
    for s in survivors:
        s["equivalent"] = equivalents.get((s["path"], s["function"], s["mutation"]))
    survivors.sort(key=lambda s: (s["path"], s["line"], s["mutation"]))

    print(f"mutants of {args.package}: {total}")
    for status in sorted(counts, key=lambda s: (s not in KILLED, s)):
        print(f"  {status:<12} {counts[status]}")
    print(f"kill rate {100 * killed / total:.1f}% ({killed}/{total}; timeouts and crashes count as killed: "
          f"{killed - counts.get('killed', 0)})")
    unexplained = [s for s in survivors if s["equivalent"] is None]
    equivalent = len(survivors) - len(unexplained)
    print(f"not killed: {len(survivors)}, of them listed as equivalent in {args.equivalents.name}: {equivalent}, "
          f"unexplained: {len(unexplained)}")
    if total > equivalent:
        print(f"killed of the mutants a test can tell apart: {100 * killed / (total - equivalent):.1f}% "
              f"({killed}/{total - equivalent})")
    for title, group in (("unexplained survivors (kill them with a test, or list them with a reason)", unexplained),
                         ("equivalent", [s for s in survivors if s["equivalent"]])):
        if group:
            print(f"{title}:")
        for s in group:
            status = "" if s["status"] == "survived" else f" [{s['status']}]"
            print(f"  {s['path']}:{s['line']}  {s['function']}  {s['mutation']}{status}  {s['key']}")
    if args.seconds is not None:
        print(f"wall time {args.seconds:.0f} s")
    summary = {"package": args.package, "total": total, "killed": killed, "counts": counts, "seconds": args.seconds,
               "survivors": survivors}
    Path("summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
