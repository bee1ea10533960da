"""The documentation stays true: every relative link in README.md and docs/ resolves, every Bazel target a command
in them names exists, and every `key=value` override in their shell blocks loads through the config loader (in the
dialect it is written in, which the loader reads the same way a run does) and every `--flag` they give a launcher
is one of its flags. A documented key that is renamed, or a target that moves, fails here. docs/ builds as a site
(mkdocs, strict), and the strict build is shown to catch a broken link and a page outside the navigation.

Reads the real source tree through the pyproject.toml data dependency (as the lint test does), tagged `external`."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

LINK = re.compile(r"\]\(([^)\s]+)\)")
SHELL_BLOCK = re.compile(r"```(?:bash|sh)\n(.*?)```", re.S)
TARGET = re.compile(r"(?:bazel|bazelw) (?:run|test|build) (//[\w/.-]*:[\w.-]+)")
OVERRIDE = re.compile(r"^(?:trainer|generator|data|environment)\.[\w.]+=")
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _root() -> str:
    return os.path.dirname(os.path.realpath("pyproject.toml"))


def _pages() -> list[str]:
    root = _root()
    docs = sorted(os.path.join("docs", name) for name in os.listdir(os.path.join(root, "docs")) if name.endswith(".md"))
    return ["README.md", *docs]


def _text(page: str) -> str:
    with open(os.path.join(_root(), page), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("page", _pages())
def test_relative_links_resolve(page):
    missing = []
    for target in LINK.findall(_text(page)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = os.path.normpath(os.path.join(_root(), os.path.dirname(page), target.split("#")[0]))
        if not os.path.exists(path):
            missing.append(target)
    assert not missing, f"{page} links to missing files: {missing}"


def _targets(root: str, label: str) -> bool:
    package, name = label[2:].split(":")
    for build in ("BUILD.bazel", "BUILD"):
        path = os.path.join(root, package, build)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return re.search(rf'name = "{re.escape(name)}"', f.read()) is not None
    return False


@pytest.mark.parametrize("page", _pages())
def test_named_bazel_targets_exist(page):
    root = _root()
    labels = sorted(set(TARGET.findall(_text(page))))
    missing = [label for label in labels if not _targets(root, label)]
    assert not missing, f"{page} names targets that do not exist: {missing}"


def _commands(page: str) -> list[list[str]]:
    """The `key=value` overrides of each whole command the page shows: its shell blocks' lines and its inline
    `bazel ...` / `python ...` commands."""
    commands = []
    lines = [line for block in SHELL_BLOCK.findall(_text(page)) for line in block.replace("\\\n", " ").splitlines()]
    prose = SHELL_BLOCK.sub("", _text(page))
    lines += [span for span in INLINE.findall(prose) if span.startswith(("bazel ", "python "))]
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        overrides = [word for word in words if OVERRIDE.match(word) and not _placeholder(word)]
        if overrides:
            commands.append(overrides)
    return commands


def _placeholder(override: str) -> bool:
    """A value written as a name to fill in (`N`, `PATH`, `DIR`, `<...>`, `...`)."""
    value = override.split("=", 1)[1]
    return bool(re.fullmatch(r"[A-Z_]+|.*<.*>.*|.*\.\.\..*", value))


def _mentioned_keys(page: str) -> list[str]:
    """Every `key=value` the page's prose shows on its own (its key must exist; its value may need company)."""
    found = []
    for span in INLINE.findall(SHELL_BLOCK.sub("", _text(page))):
        words = span.split()
        if len(words) == 1 and OVERRIDE.match(words[0]):
            found.append(words[0])
    return found


@pytest.mark.parametrize("page", _pages())
def test_documented_commands_load(page):
    import rl.backends.registry  # noqa: F401  (the strategies the config names)
    from rl.core.config import ConfigError, load_config

    refused = []
    for overrides in _commands(page):
        try:
            load_config(overrides)
        except (ConfigError, ValueError) as error:
            refused.append(f"{' '.join(overrides)}: {error}")
    assert not refused, f"{page}: documented commands the loader refuses:\n" + "\n".join(refused)


@pytest.mark.parametrize("page", _pages())
def test_documented_keys_exist(page):
    import rl.backends.registry  # noqa: F401
    from rl.core.config import ConfigError, load_config

    unknown = []
    for override in _mentioned_keys(page):
        try:
            load_config([override])
        except (ConfigError, ValueError) as error:
            if "unknown key" in str(error):
                unknown.append(f"{override}: {str(error).splitlines()[1][:200]}")
    assert not unknown, f"{page}: documented keys the loader does not know:\n" + "\n".join(unknown)


def test_a_renamed_key_is_caught(tmp_path):
    """The checks themselves, on a page that names a key that does not exist and a target that does not either."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("Set `trainer.max_restart=1`.\n\n```bash\nbazel run //rl/launch:trian -- "
                                        "trainer.seed=3 trainer.max_restart=1\n```\n")
    globals()["_root"], real = (lambda: str(tmp_path)), globals()["_root"]
    try:
        with pytest.raises(AssertionError, match=r"trainer\.max_restart: unknown key"):
            test_documented_keys_exist("README.md")
        with pytest.raises(AssertionError, match=r"trainer\.seed=3 trainer\.max_restart=1"):
            test_documented_commands_load("README.md")
        with pytest.raises(AssertionError, match="//rl/launch:trian"):
            test_named_bazel_targets_exist("README.md")
    finally:
        globals()["_root"] = real


def _build_site(config: str, site: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config, "-d", site],
                          capture_output=True, text=True, timeout=120)


def test_the_site_builds_strictly(tmp_path):
    """docs/ as a site (mkdocs.yml, strict): a broken link, a missing anchor or a page left out of the navigation
    would stop this build."""
    done = _build_site(os.path.join(_root(), "mkdocs.yml"), str(tmp_path / "site"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "faults" / "index.html").is_file()


@pytest.mark.parametrize("fault,named", [
    ("link", "nowhere.md"),  # a link to a page that does not exist
    ("page", "stray.md"),  # a page no navigation entry reaches
])
def test_the_strict_build_fails_on_a_planted_fault(tmp_path, fault, named):
    shutil.copytree(os.path.join(_root(), "docs"), tmp_path / "docs")
    shutil.copy(os.path.join(_root(), "mkdocs.yml"), tmp_path / "mkdocs.yml")
    if fault == "link":
        with open(tmp_path / "docs" / "faults.md", "a", encoding="utf-8") as f:
            f.write("\nSee [nowhere](nowhere.md).\n")
    else:
        (tmp_path / "docs" / "stray.md").write_text("# Stray\n", encoding="utf-8")
    done = _build_site(str(tmp_path / "mkdocs.yml"), str(tmp_path / "site"))
    assert done.returncode != 0 and named in done.stdout + done.stderr, done.stdout + done.stderr
