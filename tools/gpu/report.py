"""One markdown report of a GPU acceptance run (tools/gpu/acceptance.sh): the machine, every step and its result,
every figure the benchmarks wrote, every test that failed or was skipped and why, and what the run did not attempt.

    report.py OUT WORK      writes OUT/report.md

It reads what the run left (any of it may be missing: a step that did not run is reported, not an error):
WORK/run.tsv (key, value: mode, start, budget, elapsed, command), WORK/steps.tsv (step, result, seconds, detail),
WORK/versions.txt, WORK/manifest.tsv and OUT/junit.xml (the tests, merged by acceptance.py), WORK/not_here.txt,
OUT/kernels_gpu.json, OUT/plan_memory.txt, OUT/strategies.txt, OUT/tune_kernels.txt. Standard library only: it
runs with any python3.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET

TEXT_TAIL_LINES = 60  # of a benchmark's printed output
MESSAGE_CHARS = 400  # of a failure's message


def _read(path: str) -> str | None:
    if not os.path.isfile(path) or not os.path.getsize(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _rows(path: str) -> list[list[str]]:
    text = _read(path) or ""
    return [line.split("\t") for line in text.splitlines() if line.strip()]


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


def _code(text: str) -> list[str]:
    lines = text.rstrip("\n").splitlines()
    cut = len(lines) - TEXT_TAIL_LINES
    shown = ([f"... ({cut} lines above not shown)"] if cut > 0 else []) + lines[max(cut, 0):]
    return ["```text", *shown, "```", ""]


def _kernels(path: str) -> list[str]:
    text = _read(path)
    if text is None:
        return ["Not measured: no figures were written (see Steps).", ""]
    figures = json.loads(text)
    config = " ".join(f"--{k} {v}" for k, v in figures.get("config", {}).items() if v is not None)
    lines = [f"{figures.get('device')}, torch {figures.get('torch')}, CUDA {figures.get('cuda')}, triton "
             f"{figures.get('triton')}; `bench/kernels_gpu.py {config}`.", "",
             f"Device-to-device copy {_cell(figures.get('copy_gbps'))} GB/s; peak taken as "
             f"{_cell(figures.get('peak_gbps'))} GB/s ({figures.get('peak_source')}).", ""]
    lines += _table(["op", "implementation", "ms", "GB/s", "of peak"],
                    [[r["op"], r["impl"], r["ms"], r["gbps"], r["of_peak"]] for r in figures.get("bandwidth", [])])
    lines += _table(["loss path", "implementation", "ms (fwd+bwd)", "peak MiB", "speed-up over eager",
                     "peak memory / eager"],
                    [[r["path"], r["impl"], r["ms"], r.get("peak_mib", "-"),
                      f"{r['speedup_vs_eager']:.2f}x" if r.get("speedup_vs_eager") else "-",
                      f"{r['memory_vs_eager']:.2f}" if r.get("memory_vs_eager") else "-"]
                     for r in figures.get("loss", [])])
    return lines


def _cases(suites: list[ET.Element]) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(failed, skipped) test cases of the junit suites: (suite, test, message)."""
    failed, skipped = [], []
    for suite in suites:
        for case in suite.iter("testcase"):
            for kind, into in (("failure", failed), ("error", failed), ("skipped", skipped)):
                node = case.find(kind)
                if node is not None:
                    text = (node.get("message") or node.text or "").strip()
                    message = text.splitlines()[0] if text else ""
                    into.append((suite.get("name", ""), case.get("name", ""), message[:MESSAGE_CHARS]))
    return failed, skipped


def _tests(out: str, work: str) -> list[str]:
    manifest = _rows(os.path.join(work, "manifest.tsv"))
    if not manifest:
        return ["No test ran (see Steps).", ""]
    junit = os.path.join(out, "junit.xml")
    suites = list(ET.parse(junit).getroot().iter("testsuite")) if os.path.isfile(junit) else []
    counts = {}
    for suite in suites:
        c = counts.setdefault(suite.get("name", ""), dict.fromkeys(("tests", "failures", "errors", "skipped"), 0))
        for key in c:
            c[key] += int(suite.get(key, 0))
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    rows = []
    for name, rc, seconds, *_ in manifest:
        c = counts.get(name, dict.fromkeys(totals, 0))
        for key in totals:
            totals[key] += c[key]
        passed = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
        result = ("passed" if rc == "0" else "not started (budget spent)" if rc == "budget"
                  else "FAILED" if rc in ("1", "FAILED") else f"FAILED ({rc})")
        rows.append([f"`{name}`", result, seconds, passed, c["failures"] + c["errors"], c["skipped"]])
    passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    lines = [f"{totals['tests']} tests in {len(manifest)} files or targets: {passed} passed, "
             f"{totals['failures'] + totals['errors']} failed, {totals['skipped']} skipped.", ""]
    lines += _table(["file or target", "result", "s", "passed", "failed", "skipped"], rows)
    failed, skipped = _cases(suites)
    if failed:
        lines += ["### Failed", ""]
        lines += [f"- `{suite}::{test}`: {message}" for suite, test, message in failed] + [""]
    if skipped:
        reasons: dict[str, list[str]] = {}
        for suite, test, message in skipped:
            reasons.setdefault(message, []).append(f"{suite}::{test}")
        lines += ["### Skipped, by reason", ""]
        lines += _table(["reason", "tests", "e.g."],
                        [[reason, len(ids), f"`{ids[0]}`"] for reason, ids in reasons.items()])
    return lines


def _benchmark_text(path: str) -> list[str]:
    text = _read(path)
    return _code(text) if text is not None else ["Not run (see Steps).", ""]


def report(out: str, work: str) -> str:
    run = {row[0]: row[1] for row in _rows(os.path.join(work, "run.tsv")) if len(row) > 1}
    steps = _rows(os.path.join(work, "steps.tsv"))
    failed_steps = [s[0] for s in steps if s[1] == "failed"]
    verdict = f"FAILED ({', '.join(failed_steps)})" if failed_steps else "PASSED"
    lines = ["# GPU acceptance report", "",
             f"{run.get('start', '?')}, {run.get('mode', '?')} mode, {run.get('elapsed', '?')} s of a "
             f"{run.get('budget', '?')} s budget: **{verdict}**.", "",
             f"Command: `{run.get('command', '?')}`", "", "## Machine", ""]
    versions = _read(os.path.join(work, "versions.txt"))
    lines += _code(versions) if versions else ["Not recorded (see Steps).", ""]
    not_run = [f"- {s[0]}: {s[3] if len(s) > 3 else ''}" for s in steps if s[1] == "not run"]
    not_run += [f"- {line}" for line in (_read(os.path.join(work, "not_here.txt")) or "").splitlines() if line]
    sections = [
        ("Steps", _table(["step", "result", "s", "detail"], [[*s, "", "", ""][:4] for s in steps])),
        ("Kernels: bandwidth and the fused loss", _kernels(os.path.join(out, "kernels_gpu.json"))),
        ("Tests", _tests(out, work)),
        ("Memory planner against the CUDA allocator", _benchmark_text(os.path.join(out, "plan_memory.txt"))),
        ("The launcher through each strategy", _benchmark_text(os.path.join(out, "strategies.txt"))),
        ("Block sizes of the Triton kernels (OUT/launch_configs.json)",
         _benchmark_text(os.path.join(out, "tune_kernels.txt"))),
        ("Not run here, and why", [*(not_run or ["Nothing."]), ""]),
    ]
    for title, body in sections:
        lines += [f"## {title}", "", *body]
    path = os.path.join(out, "report.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(f"report: {report(*argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
