"""The GPU acceptance command (`tools/gpu_acceptance.sh`) on a machine without a GPU (CUDA hidden): it prints its
plan and exits 0, writing the same lines to $OUT/gpu_acceptance.log, and builds and runs nothing. The plan names
only test files that exist in the source tree, and every gpu-tagged test target of the tree (the BUILD files: a
`py_pytest_test` with the "gpu" tag) is in one of its lanes, so a GPU test added to the suite is not left out of the
acceptance run.

Like lint_test, it reads the real source tree through the symlink of its pyproject.toml data dependency, and is
tagged `external`: the tree it checks is not among its inputs."""

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
    wheels = tmp_path / "wheels"  # tools/gpu_wheels.sh's folder: installed only where the run goes on
    wheels.mkdir()
    result = subprocess.run(["bash", "tools/gpu_acceptance.sh", "--wheels", str(wheels)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no CUDA device visible" in result.stdout and "the plan above is all" in result.stdout
    assert not any(f"===== {step}" in result.stdout for step in ("install", "build", "tests", "bench")), \
        "it ran more than its plan"
    assert (out / "gpu_acceptance.log").read_text() == result.stdout
    lanes = result.stdout.split("lane A (GPU):\n", 1)[1].split("skipped for a missing package", 1)[0]
    planned = {line.strip() for line in lanes.splitlines() if line.startswith("  tests/")}
    root = _tree()
    assert planned and all(os.path.isfile(os.path.join(root, path)) for path in planned), planned
    gpu_tests = _gpu_tagged_sources(root)
    assert gpu_tests and gpu_tests <= planned, f"gpu-tagged tests not in the plan: {sorted(gpu_tests - planned)}"
    for package in ("ray", "vllm", "deepspeed", "megatron.core"):  # what a missing package skips, and why
        assert re.search(rf"^  {re.escape(package)} +(installed: runs|missing: skipped)", result.stdout, re.M)
