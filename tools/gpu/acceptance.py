"""Helpers of tools/gpu/acceptance.sh (the GPU acceptance run).

    acceptance.py pytest ARGS...           pytest, skipping (with the reason) tests whose packages are missing
    acceptance.py plan                     which tests this machine skips for a missing package, and why
    acceptance.py bep BEP.json MANIFEST    the manifest of a `bazel test --build_event_json_file` run
    acceptance.py merge OUT.xml MANIFEST   one junit XML from the per-file (per-target) ones, with a summary table

Without Bazel the run starts one pytest process per test file, as Bazel's py_pytest_test targets do (process groups,
CUDA state and Triton caches stay per file). MANIFEST lines are `name<TAB>rc<TAB>seconds<TAB>junit path`: a test file
and pytest's exit code, or a Bazel target and its status (PASSED and FLAKY are written as 0); rc `budget` means the
file was not started because the run's time budget was spent. A file or target that ended without its XML (a crash,
a timeout, a failed build) becomes one failing test case, a file never started one skipped case, so nothing goes
missing from the merged XML.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (package, test id pattern, what needs it): the gpu-tagged tests that cannot run without the package. The test id
# is `path/from/repo/test_file.py::test_name[params]`.
NEEDS = [
    ("ray", r"^tests/rl/trainer/test_train_gpu\.py::", "the launcher's worker group runs on Ray actors"),
    ("vllm", r"test_weight_transports_gpu\.py::test_vllm_engine", "a vLLM engine fed over CUDA IPC"),
    ("vllm", r"test_train_gpu\.py::test_colocated_vllm", "a colocated vLLM engine"),
    ("deepspeed", r"test_hidden_loss\.py::.*deepspeed", "the deepspeed strategy"),
    ("deepspeed", r"test_lora\.py::.*zero[23]", "the deepspeed strategy (ZeRO-2/3)"),
    ("deepspeed", r"test_critic\.py::.*zero[23]", "the deepspeed strategy (ZeRO-2/3)"),
    ("deepspeed", r"test_train_gpu\.py::.*\[deepspeed\]", "the deepspeed strategy"),
    ("megatron.core", r"^tests/rl/backends/megatron/test_gpu\.py::", "the megatron strategy"),
    ("megatron.core", r"test_train_gpu\.py::.*\[megatron\]", "the megatron strategy"),
]


def missing(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is None
    except (ImportError, ValueError):
        return True


def skip_reason(test_id: str) -> str | None:
    for package, pattern, why in NEEDS:
        if re.search(pattern, test_id) and missing(package):
            return f"needs {package} ({why}), which is not installed on this machine"
    return None


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        test_id = f"{os.path.relpath(str(item.path), REPO)}::{item.name}"
        reason = skip_reason(test_id)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def plan() -> int:
    for package, pattern, why in NEEDS:
        state = "missing: skipped" if missing(package) else "installed: runs"
        print(f"  {package:<14} {state:<17} {pattern}  ({why})")
    return 0


def _case(suite: ET.Element, name: str, kind: str, message: str) -> None:
    case = ET.SubElement(suite, "testcase", classname=suite.get("name", ""), name=name, time="0")
    ET.SubElement(case, kind, message=message).text = message


def merge(out: str, manifest: str) -> int:
    root = ET.Element("testsuites", name="gpu_acceptance")
    rows, totals = [], dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    with open(manifest) as f:
        entries = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    for file, rc, seconds, xml_path in entries:
        counts = dict.fromkeys(totals, 0)
        if rc != "budget" and os.path.exists(xml_path) and os.path.getsize(xml_path):
            parsed = ET.parse(xml_path).getroot()
            for suite in [parsed] if parsed.tag == "testsuite" else parsed.iter("testsuite"):
                suite.set("name", file)
                for key in counts:
                    counts[key] += int(suite.get(key, 0))
                root.append(suite)
        else:
            suite = ET.SubElement(root, "testsuite", name=file, time=seconds if rc != "budget" else "0")
            if rc == "budget":
                _case(suite, "not_run", "skipped", "not started: the run's time budget was spent")
                counts.update(tests=1, skipped=1)
            else:
                why = (f"pytest exited with {rc} before writing its report (124/137: killed by the per-file time "
                       "limit)" if rc.isdigit() else f"Bazel reports {rc} and no test report")
                _case(suite, "no_report", "error", why)
                counts.update(tests=1, errors=1)
            for key in counts:
                suite.set(key, str(counts[key]))
        # pytest's exit code 1/2/... with a readable XML still counts: a crash after the XML was written.
        ok = rc == "0"
        rows.append((file, rc, seconds, counts, ok))
        for key in totals:
            totals[key] += counts[key]
    for key, value in totals.items():
        root.set(key, str(value))
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    width = max([len(r[0]) for r in rows] + [4])
    print(f"{'file':<{width}}  {'rc':>6}  {'s':>5}  {'tests':>5}  {'fail':>4}  {'err':>4}  {'skip':>4}")
    for file, rc, seconds, c, ok in rows:
        print(f"{file:<{width}}  {rc:>6}  {seconds:>5}  {c['tests']:>5}  {c['failures']:>4}  {c['errors']:>4}  "
              f"{c['skipped']:>4}{'' if ok else '  <- FAILED'}")
    print(f"total: {totals['tests']} tests, {totals['failures']} failures, {totals['errors']} errors, "
          f"{totals['skipped']} skipped; junit: {out}")
    return 0 if all(r[4] for r in rows) else 1


def bep(events: str, manifest: str) -> int:
    """Each test target's last attempt from Bazel's build event stream (JSON lines; a stream cut short by the time
    budget is read up to its last whole line). A target that never ran has only a summary (FAILED_TO_BUILD,
    NO_STATUS): it is listed with that status."""
    results: dict[str, tuple[str, str, str]] = {}
    with open(events) as f:
        for line in f:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                break
            key = next(iter(event["id"]), "")
            if key not in ("testResult", "testSummary"):
                continue
            label = event["id"][key]["label"]
            if key == "testSummary":
                status = event.get("testSummary", {}).get("overallStatus", "NO_STATUS")
                results.setdefault(label, (status, "0", ""))
                continue
            result = event.get("testResult", {})
            xml = next((o["uri"] for o in result.get("testActionOutput", []) if o.get("name") == "test.xml"), "")
            seconds = f"{int(result.get('testAttemptDurationMillis', 0)) / 1000:.0f}"
            results[label] = (result.get("status", "NO_STATUS"), seconds, xml.removeprefix("file://"))
    with open(manifest, "w") as f:
        for label, (status, seconds, xml) in results.items():
            rc = "0" if status in ("PASSED", "FLAKY") else status
            f.write(f"{label}\t{rc}\t{seconds}\t{xml}\n")
    print(f"{len(results)} test targets reported by Bazel")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["pytest"]:
        import pytest

        return int(pytest.main(argv[1:], plugins=[sys.modules[__name__]]))
    if argv[:1] == ["plan"]:
        return plan()
    if argv[:1] == ["bep"] and len(argv) == 3:
        return bep(argv[1], argv[2])
    if argv[:1] == ["merge"] and len(argv) == 3:
        return merge(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    # Run as a script, sys.path[0] is tools/ (whose pytest/ folder must not shadow pytest): the checkout instead.
    sys.path[0] = REPO
    sys.exit(main(sys.argv[1:]))
