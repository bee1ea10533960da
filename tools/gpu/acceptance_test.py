"""The GPU acceptance command (`tools/gpu/acceptance.sh`) on a machine without a GPU, and the report it writes.

Without a GPU (CUDA hidden) it prints its plan and exits 0, writing the same lines to $OUT/gpu_acceptance.log, and
builds and runs nothing, in both modes. The bare plan names only test files that exist in the source tree, and
every gpu-tagged test target of the tree (the BUILD files: a `py_pytest_test` with the "gpu" tag) is in one of its
lanes, so a GPU test added to the suite is not left out of the acceptance run. The report's inputs (Bazel's build
event stream, pytest's junit files, the benchmark's figures) are written here by hand, and the report must show
each figure, failure, skip reason and step that did not run. A folder of wheels over one transfer to a GPU machine
is split into parts within it, every byte kept.

Like lint_test, it reads the real source tree through the symlink of its pyproject.toml data dependency, and is
tagged `external`: the tree it checks is not among its inputs."""

import json
import os
import re
import subprocess
import sys


def _tree() -> str:
    return os.path.dirname(os.path.realpath("pyproject.toml"))


def _gpu_tagged_sources(root: str) -> set[str]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "tests")):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "bazel-"))]
        if "BUILD.bazel" not in filenames:
            continue
        with open(os.path.join(dirpath, "BUILD.bazel"), encoding="utf-8") as f:
            targets = f.read().split("py_pytest_test(")[1:]
        for target in targets:
            tags = re.search(r"tags = \[([^\]]*)\]", target)
            if tags and '"gpu"' in tags.group(1):
                (src,) = re.search(r'srcs = \["([^"]+)"\]', target).groups()
                found.add(os.path.relpath(os.path.join(dirpath, src), root))
    return found


def test_without_a_gpu_it_prints_its_plan_and_exits_0(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    wheels = tmp_path / "wheels"  # tools/gpu/wheels.sh's folder: installed only where the run goes on
    wheels.mkdir()
    result = subprocess.run(["bash", "tools/gpu/acceptance.sh", "--bare", "--wheels", str(wheels)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no CUDA device visible" in result.stdout and "the plan above is all" in result.stdout
    assert not any(f"===== {step}" in result.stdout for step in ("install", "build", "tests", "bench")), \
        "it ran more than its plan"
    assert not (out / "report.md").exists()
    assert (out / "gpu_acceptance.log").read_text() == result.stdout
    lanes = result.stdout.split("lane A (GPU):\n", 1)[1].split("skipped for a missing package", 1)[0]
    planned = {line.strip() for line in lanes.splitlines() if line.startswith("  tests/")}
    root = _tree()
    assert planned and all(os.path.isfile(os.path.join(root, path)) for path in planned), planned
    gpu_tests = _gpu_tagged_sources(root)
    assert gpu_tests and gpu_tests <= planned, f"gpu-tagged tests not in the plan: {sorted(gpu_tests - planned)}"
    for package in ("ray", "vllm", "deepspeed", "megatron.core"):  # what a missing package skips, and why
        assert re.search(rf"^  {re.escape(package)} +(installed: runs|missing: skipped)", result.stdout, re.M)


def test_a_python_without_torch_on_a_machine_without_a_gpu_still_shows_the_plan(tmp_path):
    """A fresh machine's python3 has no torch: with no GPU either, the plan is all there is, exit 0 (it used to end
    "cannot import torch", exit 1). `torch` is shadowed on the path, as where it is not installed."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "torch.py").write_text("raise ImportError('No module named torch')\n")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "PYTHONPATH": str(shadow),
           "PATH": "/usr/bin:/bin"}  # no nvidia-smi
    result = subprocess.run(["bash", "tools/gpu/acceptance.sh", "--bare"], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cannot import torch" not in result.stdout and "the plan above is all" in result.stdout


def test_with_the_gpu_lock_its_plan_is_bazel_test_of_everything_and_the_gpu_benchmarks(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "RL_PYTHON_LOCK": "gpu", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(["bash", "tools/gpu/acceptance.sh"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "plan (bazel mode)" in result.stdout and "the plan above is all" in result.stdout
    assert re.search(r"^tests: \S*bazelw test --config=gpu --keep_going //\.\.\.$", result.stdout, re.M)
    for benchmark in ("//bench:kernels_gpu", "//bench:plan_memory", "//bench:strategies", "//bench:tune_kernels"):
        assert benchmark in result.stdout
    assert "===== versions" not in result.stdout, "it ran more than its plan"
    refused = subprocess.run(["bash", "tools/gpu/acceptance.sh", "--only", "lora"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "--only applies without Bazel" in refused.stderr


def _junit(path, suite, cases):
    """pytest's junit XML: cases are (name, kind, message) with kind None (passed), failure or skipped."""
    body = "".join(f'<testcase classname="{suite}" name="{name}" time="0.1">'
                   + (f'<{kind} message="{message}">{message}</{kind}>' if kind else "") + "</testcase>"
                   for name, kind, message in cases)
    counts = {k: sum(kind == k for _, kind, _ in cases) for k in ("failure", "skipped")}
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{len(cases)}" errors="0" '
                    f'failures="{counts["failure"]}" skipped="{counts["skipped"]}">{body}</testsuite></testsuites>')


def _tools(*args):
    root = _tree()
    result = subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True, timeout=60)
    return result


def test_the_report_from_bazels_event_stream_shows_every_result_figure_and_what_did_not_run(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir(), work.mkdir()
    passed_xml, failed_xml = work / "passed.xml", work / "failed.xml"
    _junit(passed_xml, "tests.rl.kernels.test_kernels_gpu",
           [("test_pack", None, ""), ("test_vllm_engine", "skipped", "needs vllm (a vLLM engine)")])
    _junit(failed_xml, "tests.rl.backends.test_bf16",
           [("test_step[fsdp]", "failure", "AssertionError: loss 0.51 vs 0.49"), ("test_step[fsdp2]", None, "")])

    def result(label, status, xml=None, millis="2500"):
        outputs = [{"name": "test.log", "uri": "file:///x/test.log"}]
        outputs += [{"name": "test.xml", "uri": f"file://{xml}"}] if xml else []
        return {"id": {"testResult": {"label": label, "run": 1, "shard": 1, "attempt": 1}},
                "testResult": {"testActionOutput": outputs, "testAttemptDurationMillis": millis, "status": status}}

    def summary(label, status):
        return {"id": {"testSummary": {"label": label}}, "testSummary": {"overallStatus": status}}

    events = [
        {"id": {"started": {}}, "started": {"command": "test"}},
        result("//tests/rl/kernels:test_kernels_gpu", "PASSED", passed_xml, "12400"),
        summary("//tests/rl/kernels:test_kernels_gpu", "PASSED"),
        result("//tests/rl/backends:test_bf16", "FAILED", failed_xml),  # first attempt, then a flaky retry
        result("//tests/rl/backends:test_bf16", "FAILED", failed_xml),
        result("//tests/rl/trainer:test_train_gpu", "TIMEOUT"),
        summary("//tests/rl/backends/megatron:test_gpu", "FAILED_TO_BUILD"),
    ]
    bep = work / "bep.json"
    bep.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"id": {"testRes')  # cut short by a timeout
    manifest = work / "manifest.tsv"
    made = _tools("tools/gpu/acceptance.py", "bep", str(bep), str(manifest))
    assert made.returncode == 0, made.stderr
    rows = [line.split("\t") for line in manifest.read_text().splitlines()]
    assert [r[:3] for r in rows] == [["//tests/rl/kernels:test_kernels_gpu", "0", "12"],
                                     ["//tests/rl/backends:test_bf16", "FAILED", "2"],
                                     ["//tests/rl/trainer:test_train_gpu", "TIMEOUT", "2"],
                                     ["//tests/rl/backends/megatron:test_gpu", "FAILED_TO_BUILD", "0"]]
    merged = _tools("tools/gpu/acceptance.py", "merge", str(out / "junit.xml"), str(manifest))
    assert merged.returncode == 1, "a failed target fails the merge"
    assert "total: 6 tests, 1 failures, 2 errors, 1 skipped" in merged.stdout, merged.stdout

    (work / "run.tsv").write_text("mode\tbazel\nstart\t2026-11-27T12:00:00Z\nbudget\t1500\nelapsed\t900\n"
                                  "command\tbash tools/gpu/acceptance.sh\n")
    (work / "steps.tsv").write_text("versions\tok\t40\t\nkernels_gpu\tok\t30\t\ntests\tfailed\t700\texit status 1\n"
                                    "plan_memory\tnot run\t-\tthe time budget was spent before it\n")
    (work / "versions.txt").write_text("torch 2.11.0+cu130 | cuda 13.0\ngpu 0: NVIDIA H100 80GB HBM3, sm_90\n")
    (out / "kernels_gpu.json").write_text(json.dumps({
        "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "cuda": "13.0", "triton": "3.6.0",
        "config": {"tokens": 4096, "vocab": 32768}, "peak_gbps": 3350.0, "peak_source": "spec", "copy_gbps": 2941.2,
        "bandwidth": [{"op": "pack", "impl": "triton", "ms": 0.234, "gbps": 1123.4, "of_peak": 0.335},
                      {"op": "pack", "impl": "cuda", "ms": "n/a (no extension)", "gbps": "-", "of_peak": "-"}],
        "loss": [{"path": "logits -> loss", "impl": "eager torch", "ms": 2.467, "peak_mib": 3250.0,
                  "speedup_vs_eager": 1.0, "memory_vs_eager": 1.0},
                 {"path": "logits -> loss", "impl": "fused triton", "ms": 0.836, "peak_mib": 812.5,
                  "speedup_vs_eager": 2.951, "memory_vs_eager": 0.25}]}))
    (out / "strategies.txt").write_text("strategy  s/step\n--------  ------\nfsdp2      0.412\n")
    written = _tools("tools/gpu/report.py", str(out), str(work))
    assert written.returncode == 0, written.stderr
    report = (out / "report.md").read_text()
    assert "bazel mode, 900 s of a 1500 s budget: **FAILED (tests)**" in report
    assert "gpu 0: NVIDIA H100 80GB HBM3, sm_90" in report
    assert "Device-to-device copy 2,941 GB/s" in report
    assert "| pack | triton | 0.234 | 1,123 | 0.335 |" in report
    assert "| pack | cuda | n/a (no extension) | - | - |" in report
    assert "| logits -> loss | fused triton | 0.836 | 812 | 2.95x | 0.25 |" in report
    assert "6 tests in 4 files or targets: 2 passed, 3 failed, 1 skipped." in report
    assert "`//tests/rl/backends:test_bf16::test_step[fsdp]`: AssertionError: loss 0.51 vs 0.49" in report
    assert "`//tests/rl/trainer:test_train_gpu::no_report`: Bazel reports TIMEOUT and no test report" in report
    assert "| `//tests/rl/backends/megatron:test_gpu` | FAILED (FAILED_TO_BUILD) |" in report
    assert "| needs vllm (a vLLM engine) | 1 | `//tests/rl/kernels:test_kernels_gpu::test_vllm_engine` |" in report
    assert "fsdp2      0.412" in report
    assert "## Memory planner against the CUDA allocator\n\nNot run (see Steps)." in report
    assert "- plan_memory: the time budget was spent before it" in report


def test_a_wheel_folder_over_one_transfer_is_split_into_parts_within_it(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    mib = 2**20
    sizes = {"a.whl": 0.6, "b.tar.gz": 0.5, "c.tar.xz": 0.4, "d.whl": 0.3}  # MiB, with a limit of 1
    contents = {name: os.urandom(int(size * mib)) for name, size in sizes.items()}
    for name, data in contents.items():
        (folder / name).write_bytes(data)
    env = {**os.environ, "GPU_WHEELS_LIMIT_MIB": "1"}
    result = subprocess.run(["bash", os.path.join(_tree(), "tools/gpu/wheels.sh"), "--split", str(folder)], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # Largest first, each into the first part with room: 0.6 + 0.4 and 0.5 + 0.3.
    parts = {p.name: {f.name: f.read_bytes() for f in p.iterdir()} for p in folder.iterdir()}
    assert {k: sorted(v) for k, v in parts.items()} == {"part1": ["a.whl", "c.tar.xz"],
                                                        "part2": ["b.tar.gz", "d.whl"]}
    assert {n: b for files in parts.values() for n, b in files.items()} == contents
    assert "wheels: 1.8 MiB in 2 parts" in result.stdout
    assert "wheels/part1  (1.0 MiB, 2 files)" in result.stdout
    assert "bash tools/gpu/acceptance.sh --bare --wheels wheels" in result.stdout

    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "ray.tar.xz").write_bytes(os.urandom(int(1.5 * mib)))
    too_big = subprocess.run(["bash", os.path.join(_tree(), "tools/gpu/wheels.sh"), "--split", "big"], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert too_big.returncode != 0 and "ray.tar.xz alone (1.5 MiB) is over the 1 MiB" in too_big.stderr
