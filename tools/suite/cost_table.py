"""Markdown table of a `bazel test` run's targets and their times, from the summary Bazel prints at the end.

    ./bazelw test //... 2>&1 | tee /tmp/suite.log
    python3 tools/suite/cost_table.py /tmp/suite.log [--budget_s=300]

Targets over the budget are marked; the total is the sum of the targets' own times (Bazel runs as many at once as the
machine has cores, so the wall time is shorter).
"""

from __future__ import annotations

import argparse
import re
import sys

SUMMARY = re.compile(r"^(//\S+)\s+(?:\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS)\s+in\s+([\d.]+)s")


def parse(lines) -> list[tuple[str, str, float]]:
    return [(m.group(1), m.group(2), float(m.group(3))) for m in map(SUMMARY.match, lines) if m]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    parser.add_argument("--budget_s", type=float, default=300.0)
    args = parser.parse_args()
    with open(args.log, encoding="utf-8", errors="replace") as f:
        rows = sorted(parse(f), key=lambda row: -row[2])
    if not rows:
        print(f"{args.log}: no target summary lines (run `bazel test` to the end)", file=sys.stderr)
        return 1
    print("| target | result | seconds |\n|---|---|---:|")
    for target, status, seconds in rows:
        mark = " **over budget**" if seconds > args.budget_s else ""
        print(f"| `{target}` | {status} | {seconds:.1f}{mark} |")
    print(f"| **{len(rows)} targets** | | **{sum(r[2] for r in rows):.0f}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
