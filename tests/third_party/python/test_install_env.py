"""The pinned-environment installer: a correct lock installs, a tampered hash or a malformed line fails clearly."""

import os
import subprocess
import sys

import pytest

INSTALLER = "third_party/python/install_env.py"
LOCK = "third_party/python/requirements_lock.txt"
PACKAGE = "mdurl"  # tiny, pure Python, no dependencies
SDIST = "antlr4-python3-runtime"  # a small package published only as source


def _base_python() -> str:
    # Tests run in the venv, which has no pip; the installer runs under the interpreter the venv was made from.
    return getattr(sys, "_base_executable", sys.executable)


def _locked_line(name: str) -> str:
    with open(LOCK) as f:
        return next(line.strip() for line in f if line.startswith(name + "=="))


def _install(tmp_path, lock_text: str, sdists: tuple[str, ...] = (), venv: str = "venv"
             ) -> subprocess.CompletedProcess:
    lock = tmp_path / "lock.txt"
    lock.write_text(lock_text)
    cmd = [_base_python(), INSTALLER, "--lock", str(lock), "--venv", str(tmp_path / venv)]
    cmd += [arg for name in sdists for arg in ("--sdist", name)]
    env = {**os.environ, "RLPOST_WHEEL_CACHE": str(tmp_path / "wheels")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def test_locked_package_installs(tmp_path):
    result = _install(tmp_path, _locked_line(PACKAGE) + "\n")
    assert result.returncode == 0, result.stderr
    python = tmp_path / "venv" / "bin" / "python3"
    probe = subprocess.run([str(python), "-c", f"import {PACKAGE}, sys; print(sys.prefix)"], capture_output=True,
                           text=True)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == str(tmp_path / "venv")


def test_source_only_package_builds_against_the_locked_setuptools_once(tmp_path):
    # antlr4-python3-runtime (OmegaConf's parser runtime) is published only as source: the installer builds it
    # without build isolation, so nothing outside the lock is fetched to build it, into a wheel kept in the wheel
    # cache that a second environment of the same lock installs instead of building it again.
    lines = [_locked_line(name) for name in ("setuptools", SDIST)]
    version = _locked_line(SDIST).split("==")[1].split()[0]
    for venv, said in (("venv", "building wheels from source"), ("second", "wheels built before")):
        result = _install(tmp_path, "\n".join(lines) + "\n", sdists=(SDIST,), venv=venv)
        assert result.returncode == 0, result.stderr
        assert said in result.stdout, result.stdout
        python = tmp_path / venv / "bin" / "python3"
        code = f"import antlr4, importlib.metadata as m; print(m.version('{SDIST}'))"
        probe = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
        assert probe.returncode == 0, probe.stderr
        assert probe.stdout.strip() == version
    (built,) = (tmp_path / "wheels").iterdir()  # one key, no half-built directory left
    assert sorted(path.name for path in built.iterdir()) == [f"antlr4_python3_runtime-{version}-py3-none-any.whl",
                                                             "sources.txt"]
    assert (built / "sources.txt").read_text() == _locked_line(SDIST) + "\n"


def test_tampered_hash_fails_with_a_clear_message(tmp_path):
    line = _locked_line(PACKAGE)
    digest = line.split("sha256:")[1]
    tampered = line.replace(digest, ("0" if digest[0] != "0" else "1") + digest[1:])
    result = _install(tmp_path, tampered + "\n")
    assert result.returncode != 0
    assert "does not match the file pip fetched" in result.stderr
    assert PACKAGE in result.stderr
    assert "update_lock.sh" in result.stderr


def test_line_without_hash_is_rejected_with_its_line_number(tmp_path):
    result = _install(tmp_path, "# header\n" + _locked_line(PACKAGE) + "\nrequests==2.0\n")
    assert result.returncode != 0
    assert "lock.txt:3" in result.stderr and "requests==2.0" in result.stderr


def test_every_lock_line_is_hash_pinned():
    sys.path.insert(0, os.path.dirname(INSTALLER))
    from install_env import split_lock

    wheels, sdists = split_lock(LOCK, {SDIST, "deepspeed"})
    names = {line.split("==")[0] for line in wheels + sdists}
    assert [line.split("==")[0] for line in sdists] == [SDIST, "deepspeed"]
    assert {"torch", "transformers", "triton", "ray", "megatron-core", "pytest", "omegaconf"} <= names
    assert any(line.startswith("torch==2.13.0+cpu ") for line in wheels)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
