"""Builds a venv from a hash-pinned lock: the installer behind //third_party/python:python_env.bzl.

Run by the base interpreter with the standard library only. Every package comes from the lock with its sha256
(`--require-hashes --no-deps`): nothing else is resolved. Wheels are installed first, by uv where it can be had
(pinned in installer_lock.txt, kept once per machine; the CPU lock in ~40 s on 2 cores with nothing cached, against
pip's ~80 s; byte code compiled as pip does), else by pip, from the index and find-links pip is configured with.
Source-only packages (deepspeed, antlr4-python3-runtime) are then built without isolation against the setuptools and
torch just installed, into wheels kept once per machine (`wheel_cache_dir`) under a key of everything the build
depends on, so a fresh clone installs them instead of compiling DeepSpeed again (~60 s on 2 cores).
Beside a CPU torch, torchvision_cpu.py (next to this file) goes into site-packages with a `.pth` line that imports it,
so PyPI's CUDA-built torchvision imports there.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import venv

PIP_NOISE = "is ignored: it is neither a file nor a directory"
INSTALLER_LOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "installer_lock.txt")
LOCK_LINE = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==\S+ --hash=sha256:[0-9a-f]{64}$")


class EnvError(RuntimeError):
    pass


def split_lock(lock_path: str, sdist_packages: set[str]) -> tuple[list[str], list[str]]:
    """(wheel lines, sdist lines); every line must be `name==version --hash=sha256:<64 hex>`."""
    wheels, sdists = [], []
    with open(lock_path) as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            match = LOCK_LINE.match(line)
            if not match:
                raise EnvError(f"{lock_path}:{number}: expected 'name==version --hash=sha256:<64 hex>', got '{line}'")
            (sdists if match["name"].lower() in sdist_packages else wheels).append(line)
    return wheels, sdists


def _pip(python: str, command: str) -> list[str]:
    """pip's `command` (install, wheel) for the venv of `python`, quiet, without dependencies or questions."""
    return [sys.executable, "-m", "pip", "--python", python, command, "--no-deps", "--disable-pip-version-check",
            "--no-input", "--quiet"]


def pip_run(python: str, command: str, lines: list[str], lock_path: str, extra: list[str], env: dict[str, str]
            ) -> None:
    """`pip install` or `pip wheel` of hash-pinned `lines` for the venv of `python`."""
    cmd = [*_pip(python, command), "--require-hashes", *extra, "-r", _requirements_file(python, lines)]
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if result.returncode == 0:
        return
    errors = _pip_errors(result.stderr)
    if "DO NOT MATCH THE HASHES" in errors:
        raise EnvError(
            f"a sha256 in {lock_path} does not match the file pip fetched:\n{errors}\n"
            "If you changed the requirements, regenerate the lock: bash third_party/python/update_lock.sh; "
            "otherwise the lock or the package index has been tampered with."
        )
    raise EnvError(f"pip {command} from {lock_path} failed (exit {result.returncode}):\n{errors}")


def _pip_errors(stderr: str) -> str:
    """pip's stderr without its warnings about configured local indexes that do not exist."""
    return "\n".join(line for line in stderr.splitlines() if PIP_NOISE not in line)


def _requirements_file(python: str, lines: list[str]) -> str:
    """`lines` written as a requirements file beside the venv of `python`."""
    requirements = os.path.join(os.path.dirname(python), "..", "lock-part.txt")
    with open(requirements, "w") as f:
        f.write("\n".join(lines) + "\n")
    return requirements


def uv_binary() -> str | None:
    """uv from installer_lock.txt, installed by pip once per machine beside the built wheels' cache; None (said why)
    where it cannot be had, and pip installs everything."""
    with open(INSTALLER_LOCK) as f:
        line = next(raw.strip() for raw in f if raw.strip() and not raw.startswith("#"))
    home = os.path.join(os.path.dirname(wheel_cache_dir()), "uv-" + hashlib.sha256(line.encode()).hexdigest()[:12])
    binary = os.path.join(home, "bin", "uv")
    if os.access(binary, os.X_OK):
        return binary
    try:
        os.makedirs(os.path.dirname(home), exist_ok=True)
        work = tempfile.mkdtemp(prefix=".uv-", dir=os.path.dirname(home))
    except OSError as error:
        print(f"uv cannot be kept in {os.path.dirname(home)} ({error}); installing with pip")
        return None
    try:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "--no-input",
               "--quiet", "--require-hashes", "--only-binary=:all:", "--target", work, "-r", INSTALLER_LOCK]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0 or not os.access(os.path.join(work, "bin", "uv"), os.X_OK):
            errors = _pip_errors(result.stderr)
            print(f"uv could not be installed from {INSTALLER_LOCK}; installing with pip:\n{errors}")
            return None
        with contextlib.suppress(OSError):  # installed beside this run and renamed first: use that one
            os.rename(work, home)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return binary if os.access(binary, os.X_OK) else None


def pip_sources() -> tuple[list[str], dict[str, str]]:
    """pip's configured index, remote extra indexes and find-links as uv's options, and its certificate bundle as
    uv's SSL_CERT_FILE. Local extra indexes are left out: uv takes the first file of a version it finds and then checks
    its hash, where pip takes the file whose hash the lock holds, so a local mirror holding another build of a
    version (a py310 wheel where PyPI has py311's) fails uv and not pip. Local paths that do not exist are left out,
    as pip ignores them."""
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    options, env = [], {}
    for raw in listing.stdout.splitlines():
        key, _, value = raw.partition("=")
        name, values = key.rsplit(".", 1)[-1], value.strip().strip("'\"").split()
        for source in values:
            local = source[len("file://"):] if source.startswith("file://") else source
            if "://" not in local and not os.path.exists(local):
                continue
            if name == "extra-index-url" and source.startswith("file://"):
                continue
            if name in ("index-url", "extra-index-url", "find-links") and source not in options:
                options += [f"--{name}", source]
            elif name == "cert":
                env["SSL_CERT_FILE"] = source
    return options, env


def install_wheels(python: str, lines: list[str], lock_path: str) -> None:
    """The lock's wheels into the venv of `python`: by uv, else (or where uv fails: pip's errors are the ones
    explained) by pip."""
    uv = uv_binary()
    if uv is not None:
        sources, env = pip_sources()
        # pip's choice among several indexes: the pinned version from whichever has it (the hashes decide trust)
        cmd = [uv, "pip", "install", "--quiet", "--python", python, "--no-deps", "--require-hashes",
               "--only-binary", ":all:", "--compile-bytecode", "--index-strategy", "unsafe-best-match", *sources,
               "-r", _requirements_file(python, lines)]
        result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
        if result.returncode == 0:
            return
        print(f"uv failed (exit {result.returncode}); installing with pip:\n{result.stderr}")
    pip_run(python, "install", lines, lock_path, ["--only-binary=:all:"], {})


EXCLUDED_MARK = "# excluded:"  # written by lock_from_report.py: dependencies the lock keeps out on purpose


def excluded_from(lock_path: str) -> set[str]:
    with open(lock_path) as f:
        return {name.lower() for line in f if line.startswith(EXCLUDED_MARK)
                for name in line[len(EXCLUDED_MARK):].split()}


def _allowed(line: str, excluded: set[str]) -> bool:
    """`pip check`'s "a requires b, which is not installed." for a b the lock excluded on purpose."""
    words = line.split()  # "<name> <version> requires <dependency>, which is not installed."
    return (len(words) >= 4 and words[2] == "requires" and words[3].rstrip(",").lower() in excluded
            and line.endswith("which is not installed."))


def build_env(lock_path: str, venv_dir: str, sdist_packages: set[str]) -> None:
    wheels, sdists = split_lock(lock_path, sdist_packages)
    excluded = excluded_from(lock_path)
    venv.EnvBuilder(with_pip=False, clear=True).create(venv_dir)
    python = os.path.join(venv_dir, "bin", "python3")
    install_wheels(python, wheels, lock_path)
    if sdists:
        install_built_wheels(python, sdists, wheels, lock_path)
    if _cpu_torch_with_torchvision(wheels):
        _install_torchvision_cpu(python)
    check = subprocess.run([sys.executable, "-m", "pip", "--python", python, "check"], capture_output=True, text=True)
    problems = [line for line in check.stdout.splitlines() if line.strip() and not _allowed(line, excluded)]
    if check.returncode != 0 and (problems or check.stderr.strip()):
        raise EnvError(f"pip check found inconsistent requirements in {lock_path}:\n" + "\n".join(problems)
                       + check.stderr)
    print(f"installed {len(wheels) + len(sdists)} packages from {lock_path} into {venv_dir}")


# DeepSpeed's ops are JIT-built when first used, except the CPU shared-memory all-reduce, which every CPU run
# initializes: build that one with the wheel. The built wheel depends on these variables, so pip's cache is bypassed.
SDIST_BUILD_ENV = {"DS_BUILD_OPS": "0", "DS_BUILD_SHM_COMM": "1"}
SOURCES = "sources.txt"  # in a cache entry: the hash-pinned lines its wheels were built from; written last


def wheel_cache_dir() -> str:
    """`RLPOST_WHEEL_CACHE`, else `$XDG_CACHE_HOME/rlpost/wheels` (~/.cache/rlpost/wheels)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("RLPOST_WHEEL_CACHE") or os.path.join(root, "rlpost", "wheels")


def built_wheels_key(sdists: list[str], wheels: list[str]) -> str:
    """What a build from source depends on: the packages' hash-pinned lines, the build variables, the interpreter,
    and every wheel installed before it (torch's headers, setuptools)."""
    recipe = {"sdists": sdists, "env": SDIST_BUILD_ENV, "python": sys.version, "wheels": sorted(wheels),
              "machine": os.uname().machine}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def install_built_wheels(python: str, sdists: list[str], wheels: list[str], lock_path: str) -> None:
    """Build the source-only packages into wheels once (a directory of the cache named by their key, written under a
    temporary name and renamed whole, so a half-built one is never used), then install those wheels. Where the cache
    cannot be written they are built in a temporary directory, as without a cache."""
    cache = wheel_cache_dir()
    built = os.path.join(cache, built_wheels_key(sdists, wheels))
    names = ", ".join(line.split()[0] for line in sdists)
    if os.path.isfile(os.path.join(built, SOURCES)):
        print(f"{names}: wheels built before, from {built}")
        _install_wheels(python, built)
        return
    print(f"{names}: building wheels from source into {built}")
    try:
        os.makedirs(cache, exist_ok=True)
        work = tempfile.mkdtemp(prefix=".building-", dir=cache)
    except OSError as error:
        print(f"wheel cache {cache} cannot be written ({error}); building in a temporary directory")
        work, built = tempfile.mkdtemp(prefix="rlpost-wheels-"), None
    try:
        pip_run(python, "wheel", sdists, lock_path, ["--no-build-isolation", "--no-cache-dir", "-w", work],
                SDIST_BUILD_ENV)
        with open(os.path.join(work, SOURCES), "w") as f:
            f.write("\n".join(sdists) + "\n")  # the hash-checked sources these wheels were built from
        _install_wheels(python, work)
        if built is not None:
            with contextlib.suppress(OSError):  # the same key built beside this run and renamed first: keep those
                os.rename(work, built)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _install_wheels(python: str, directory: str) -> None:
    files = sorted(os.path.join(directory, name) for name in os.listdir(directory) if name.endswith(".whl"))
    cmd = [*_pip(python, "install"), "--no-index", *files]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise EnvError(f"installing the wheels built from source in {directory} failed (exit {result.returncode}):"
                       f"\n{result.stderr}\nRemove that directory to build them again.")


def _cpu_torch_with_torchvision(lines: list[str]) -> bool:
    names = {line.split("==")[0].lower(): line.split()[0] for line in lines}
    return "torchvision" in names and names.get("torch", "").endswith("+cpu")


def _install_torchvision_cpu(python: str) -> None:
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchvision_cpu.py"), site)
    with open(os.path.join(site, "torchvision_cpu.pth"), "w") as f:
        f.write("import torchvision_cpu\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lock", required=True)
    parser.add_argument("--venv", required=True)
    parser.add_argument("--sdist", action="append", default=[], help="package built from its source archive")
    args = parser.parse_args()
    try:
        build_env(args.lock, args.venv, {name.lower() for name in args.sdist})
    except EnvError as error:
        print(f"python_env: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
