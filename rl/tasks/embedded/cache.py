"""A per-user cache of the warmed-up embedded model: the warm-up is paid once per machine, not once per run directory.

Where: `$RLPOST_CACHE_DIR`, else `$XDG_CACHE_HOME/rlpost`, else `~/.cache/rlpost`; entries under `embedded/<key>`
(`embedded-vl/<key>` for the visual task's model, whose sources are its own package's).
The key digests the recipe (the seed included), the source files that determine the weights (the family's own and
those of the `rl.launch.sft` run that warms the model up) and the torch and transformers versions, so a change to any
of them makes a new entry. An entry is built in a staging directory and
renamed into place with its marker written last; the marker records the sha256 of every file, checked on each reuse:
a damaged entry is rebuilt, never used.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

CACHE_ENV = "RLPOST_CACHE_DIR"
MARKER = "embedded.json"  # the checkpoint marker of `rl.tasks.embedded.prepare`
SOURCES = Path(__file__).parent
WEIGHT_SOURCES = ("model.py", "prepare.py", "task.py", "tokenizer.py", "warmup.py")  # what the weights depend on
# the files of the warm-up's `rl.launch.sft` run (the default strategy on one worker) that its numbers go through: the
# defaults, the data's encoding, packing, the loss, the schedule, the step; relative to the `rl` package. The default
# strategy's backend module is added through the registry (`run_source_files`).
RUN_SOURCES = ("core/config/defaults.yaml", "core/data/supervised.py", "core/packing/batch.py",
               "core/packing/builders.py", "core/algorithms/sft_loss.py", "core/algorithms/lr_schedule.py",
               "trainer/supervised/driver.py", "trainer/supervised/sft_loop.py", "backends/base.py",
               "backends/hf_forward.py", "backends/hf_model.py", "backends/worker.py")
RL_PACKAGE = SOURCES.parents[1]


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlpost"


@dataclass(frozen=True)
class Family:
    """Which model a cache entry holds: its folder under the cache, and the source files its weights depend on."""

    name: str = "embedded"
    sources: Path = SOURCES
    files: tuple[str, ...] = WEIGHT_SOURCES
    run_sources: tuple[str, ...] = RUN_SOURCES


EMBEDDED_FAMILY = Family()


def entry_key(recipe, family: Family = EMBEDDED_FAMILY) -> str:
    """Digest of what determines the warmed-up weights: the recipe, the code that builds them, torch and
    transformers."""
    import torch
    import transformers

    sources = family.sources
    digest = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode())
    for name in family.files:
        digest.update(name.encode() + b"\0" + (sources / name).read_bytes() + b"\0")
    for path in run_source_files(family.run_sources):
        digest.update(path.relative_to(RL_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(f"torch {torch.__version__} transformers {transformers.__version__}".encode())
    return digest.hexdigest()[:24]


def run_source_files(names: tuple[str, ...]) -> list[Path]:
    """`names` under the `rl` package, and the module of the backend that defaults.yaml's strategy names."""
    import yaml

    from rl.backends.registry import STRATEGIES

    strategy = yaml.safe_load((RL_PACKAGE / "core/config/defaults.yaml").read_text())["trainer"]["strategy"]
    module = STRATEGIES.get(strategy).backend.partition(":")[0]
    return [RL_PACKAGE / name for name in names] + [RL_PACKAGE.parent / (module.replace(".", "/") + ".py")]


def file_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file below `directory` but the marker, by relative path."""
    found = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = path.relative_to(directory).as_posix()
        if relative != MARKER:
            found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def damage(entry: Path, recipe) -> list[str]:
    """What is wrong with the entry for `recipe`: no readable marker, another recipe, missing or changed files."""
    try:
        marker = json.loads((entry / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [f"no readable {MARKER}"]
    if marker.get("recipe") != asdict(recipe) or not isinstance(marker.get("metrics"), dict):
        return [f"{MARKER} is for another recipe"]
    recorded = marker.get("files")
    if not isinstance(recorded, dict) or not recorded:
        return [f"{MARKER} records no file digests"]
    actual = file_digests(entry)
    return [f"{name} {'missing' if name not in actual else 'changed (sha256)'}"
            for name, sha in sorted(recorded.items()) if actual.get(name) != sha]


def cached_checkpoint(recipe, root: Path, build: Callable[[Path], object],
                      log: Callable[[str], None] | None, family: Family = EMBEDDED_FAMILY) -> Path | None:
    """The verified entry for `recipe` under `root`, made with `build(entry)` first where it is missing or damaged
    (`build` stages and renames); None, with a warning, where `root` cannot be written."""
    try:
        parent = root / family.name
        parent.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".probe.", dir=parent))
    except OSError as error:
        print(f"warning: embedded model cache {root} cannot be written ({error}); the warm-up runs in the run "
              f"directory (set {CACHE_ENV} to a writable directory to keep it)", file=sys.stderr, flush=True)
        return None
    entry = parent / entry_key(recipe, family)
    with _building(parent / f".{entry.name}.lock", entry, log):
        return _verified_or_built(entry, recipe, build, log, family)


@contextlib.contextmanager
def _building(lock_path: Path, entry: Path, log: Callable[[str], None] | None):
    """One process at a time checks and builds an entry: two runs started together (or two test targets) wait for
    one warm-up instead of paying two on the same cores."""
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"embedded model cache: another process is building {entry.name}; waiting for it", file=sys.stderr,
                  flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _verified_or_built(entry: Path, recipe, build: Callable[[Path], object], log: Callable[[str], None] | None,
                       family: Family) -> Path:
    if entry.exists():
        problems = damage(entry, recipe)
        if not problems:
            if log is not None:
                log(f"{family.name}: cached model {entry}")
            return entry
        print(f"embedded model cache: {entry} is damaged ({'; '.join(problems)}); rebuilding it", file=sys.stderr,
              flush=True)
        retired = Path(tempfile.mkdtemp(prefix=f".{entry.name}.damaged.", dir=entry.parent))
        os.replace(entry, retired / entry.name)
        shutil.rmtree(retired, ignore_errors=True)
    build(entry)
    problems = damage(entry, recipe)
    if problems:
        raise OSError(f"embedded model cache: {entry} is damaged right after it was built ({'; '.join(problems)})")
    return entry
