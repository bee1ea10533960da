"""The per-user cache of the warmed-up embedded model: built once, copied into later run dirs, verified on reuse
(a damaged entry is rebuilt), keyed by recipe, seed and code, and skipped with a warning where it cannot be written.
The warm-up itself is `tests.testing.untrained_warmup`'s stand-in: the cache's bookkeeping is under test."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from rl.tasks.embedded import cache
from rl.tasks.embedded import prepare as embedded_prepare
from rl.tasks.embedded.cache import CACHE_ENV, default_cache_dir, entry_key
from rl.tasks.embedded.prepare import Recipe, prepare_embedded_default
from tests.testing.untrained_warmup import UntrainedWarmup

SEED, STEPS = 5, 2


def weights(model_dir):
    return load_file(model_dir / "model.safetensors")


def same_weights(first, second) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)


def prepare(workdir, cache_dir, messages=None):
    log = messages.append if messages is not None else None
    return prepare_embedded_default(workdir, seed=SEED, warmup_steps=STEPS, log=log, cache_dir=cache_dir)


@pytest.fixture(scope="module")
def warm_ups():
    """Every warm-up the tests below start, in order."""
    warm_up = UntrainedWarmup()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embedded_prepare, "warm_up_model", warm_up)
        yield warm_up.recipes


@pytest.fixture(scope="module")
def built(tmp_path_factory, warm_ups):
    """A cache holding one entry, and the run dir of the call that built it."""
    root = tmp_path_factory.mktemp("cache")
    job = prepare(tmp_path_factory.mktemp("run"), root)
    assert warm_ups == [Recipe(seed=SEED, warmup_steps=STEPS)]
    return root, job


def entry_of(root):
    return root / "embedded" / entry_key(Recipe(seed=SEED, warmup_steps=STEPS))


def test_the_first_run_dir_pays_the_warm_up_and_later_ones_copy_the_entry(built, warm_ups, tmp_path):
    root, first = built
    assert same_weights(weights(entry_of(root)), weights(first.model_path))
    later_messages, before = [], len(warm_ups)
    later = prepare(tmp_path, root, later_messages)
    assert len(warm_ups) == before, "a later run dir warmed up again"
    assert any(str(entry_of(root)) in m for m in later_messages)
    assert later.model_path == tmp_path / "model"  # a copy in the run dir, not the entry itself
    assert same_weights(weights(later.model_path), weights(first.model_path))
    assert later.metrics == first.metrics


def test_a_damaged_entry_is_rebuilt_and_never_used(built, warm_ups, tmp_path, capsys):
    root, first = built
    good = weights(first.model_path)
    damaged = root / "damaged"
    shutil.copytree(root / "embedded", damaged / "embedded")
    blob = entry_of(damaged) / "model.safetensors"
    data = bytearray(blob.read_bytes())
    data[-8:] = bytes(8)  # the last weights' bytes: the file still loads, with other numbers
    blob.write_bytes(bytes(data))
    assert not same_weights(weights(entry_of(damaged)), good)
    before = len(warm_ups)
    job = prepare(tmp_path, damaged)
    assert "model.safetensors changed" in capsys.readouterr().err
    assert len(warm_ups) == before + 1, "the damaged entry was not rebuilt"
    assert same_weights(weights(job.model_path), good)  # the same recipe builds the same weights
    assert same_weights(weights(entry_of(damaged)), good)
    assert cache.damage(entry_of(damaged), Recipe(seed=SEED, warmup_steps=STEPS)) == []


def test_the_key_follows_the_seed_the_recipe_and_the_code(tmp_path):
    recipe = Recipe(seed=SEED, warmup_steps=STEPS)
    assert entry_key(recipe) == entry_key(Recipe(seed=SEED, warmup_steps=STEPS))
    assert entry_key(recipe) != entry_key(Recipe(seed=SEED + 1, warmup_steps=STEPS))
    assert entry_key(recipe) != entry_key(Recipe(seed=SEED, warmup_steps=STEPS + 1))
    sources = tmp_path / "sources"
    shutil.copytree(cache.SOURCES, sources)
    copy = cache.Family(sources=sources)
    assert entry_key(recipe, copy) == entry_key(recipe)
    with open(sources / "warmup.py", "a") as code:
        code.write("\n# changed\n")
    assert entry_key(recipe, copy) != entry_key(recipe)


def test_an_unwritable_cache_falls_back_to_the_run_dir_with_a_warning(built, warm_ups, tmp_path, capsys):
    _, first = built
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache would go")
    before = len(warm_ups)
    job = prepare(tmp_path / "run", blocked)
    assert "cannot be written" in capsys.readouterr().err
    assert len(warm_ups) == before + 1, "warmed up in the run dir"
    assert blocked.is_file()
    assert same_weights(weights(job.model_path), weights(first.model_path))


def test_the_cache_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "rlpost"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "rlpost"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


def test_two_processes_asking_at_once_pay_one_warm_up(tmp_path):
    """Two runs (or two test targets) started together: the second waits for the first's entry instead of warming up
    beside it on the same cores. Each process marks its arrival at the cache (after its imports, whose time varies
    under load); a build records itself and holds the entry until both have arrived and a second more, so that the
    other process meets the lock whichever started first."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import json, os, sys, time
        from dataclasses import asdict
        from pathlib import Path
        from rl.tasks.embedded import cache
        from rl.tasks.embedded.prepare import Recipe

        arrivals = Path({str(tmp_path / "arrivals")!r})

        def build(entry):
            with open({str(tmp_path / "builds")!r}, "a") as f:
                f.write(str(os.getpid()) + "\\n")
            deadline = time.monotonic() + 60
            while len(list(arrivals.iterdir())) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
            staging = entry.with_name(entry.name + ".staging")
            staging.mkdir()
            (staging / "model.bin").write_bytes(b"weights")
            marker = {{"recipe": asdict(Recipe(seed=1)), "metrics": {{}}, "files": cache.file_digests(staging)}}
            (staging / cache.MARKER).write_text(json.dumps(marker))
            os.replace(staging, entry)

        (arrivals / str(os.getpid())).touch()
        print(cache.cached_checkpoint(Recipe(seed=1), Path(sys.argv[1]), build, None))
    """)
    (tmp_path / "arrivals").mkdir()
    runs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "cache")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert all(run.returncode == 0 for run in runs), outputs
    assert len((tmp_path / "builds").read_text().splitlines()) == 1, "both processes warmed up"
    assert outputs[0][0] == outputs[1][0]
    assert sum("another process is building" in err for _, err in outputs) == 1
