"""Preparing the embedded default: loadable data and checkpoint (a real warm-up of a few steps, the same weights for
the same seed anywhere), reuse of a finished build, rebuilds otherwise (with `tests.testing.untrained_warmup`'s
stand-in for the warm-up: the bookkeeping is under test)."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl.core.data import load_prompt_dataset
from rl.tasks.embedded import prepare
from rl.tasks.embedded.prepare import MARKER, Recipe, prepare_embedded_default
from tests.testing.untrained_warmup import UntrainedWarmup

STEPS = 3  # enough to exercise the pipeline; the default recipe's quality is measured elsewhere


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    torch.set_num_threads(1)
    workdir = tmp_path_factory.mktemp("embedded")
    return workdir, prepare_embedded_default(workdir, seed=7, warmup_steps=STEPS, log=None)


def weights(model_path):
    return load_file(model_path / "model.safetensors")


def test_outputs_load_with_the_project_readers_and_transformers(prepared):
    workdir, job = prepared
    recipe = Recipe(seed=7, warmup_steps=STEPS)
    assert len(load_prompt_dataset([job.train_data])) == recipe.n_train
    assert len(load_prompt_dataset([job.val_data])) == recipe.n_val
    model = AutoModelForCausalLM.from_pretrained(job.model_path)
    tokenizer = AutoTokenizer.from_pretrained(job.model_path)
    assert model.config.vocab_size == len(tokenizer)
    marker = json.loads((job.model_path / MARKER).read_text())
    assert marker["recipe"]["seed"] == 7 and marker["recipe"]["warmup_steps"] == STEPS
    assert 0.0 <= job.metrics["val_accuracy"] <= 1.0
    assert sorted(path.name for path in workdir.iterdir()) == ["data", "model"]


def test_a_matching_finished_build_is_reused(prepared, monkeypatch):
    workdir, job = prepared
    before = (job.model_path / "model.safetensors").stat().st_mtime_ns

    def fail(*args):
        raise AssertionError("the checkpoint was rebuilt")

    monkeypatch.setattr(prepare, "build_checkpoint", fail)
    (job.train_data).unlink()
    again = prepare_embedded_default(workdir, seed=7, warmup_steps=STEPS, log=None)
    assert again == job
    assert job.train_data.is_file()
    assert (job.model_path / "model.safetensors").stat().st_mtime_ns == before


def test_same_seed_gives_the_same_checkpoint_elsewhere(prepared, tmp_path):
    _, job = prepared
    other = prepare_embedded_default(tmp_path, seed=7, warmup_steps=STEPS, log=None)
    first, second = weights(job.model_path), weights(other.model_path)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert other.train_data.read_bytes() == job.train_data.read_bytes()


def test_a_different_recipe_or_an_unfinished_build_is_rebuilt(tmp_path, monkeypatch):
    warm_up = UntrainedWarmup()
    monkeypatch.setattr(prepare, "warm_up_model", warm_up)
    first = prepare_embedded_default(tmp_path, seed=3, warmup_steps=1, log=None)
    old = weights(first.model_path)
    second = prepare_embedded_default(tmp_path, seed=3, warmup_steps=2, log=None)
    assert json.loads((second.model_path / MARKER).read_text())["recipe"]["warmup_steps"] == 2
    assert not torch.equal(old["model.embed_tokens.weight"], weights(second.model_path)["model.embed_tokens.weight"])
    (second.model_path / MARKER).unlink()
    prepare_embedded_default(tmp_path, seed=3, warmup_steps=2, log=None)
    assert (second.model_path / MARKER).is_file()
    assert [recipe.warmup_steps for recipe in warm_up.recipes] == [1, 2, 2], "the unfinished build was not redone"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data", "model"]
