"""Preparing the embedded default: loadable data and checkpoint (a real warm-up of a few steps, the same weights for
the same seed anywhere), the recorded greedy accuracy recomputed independently, reuse of a finished build,
rebuilds otherwise (with `tests.testing.untrained_warmup`'s stand-in for the warm-up: the bookkeeping is under
test)."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl.core.data import load_prompt_dataset
from rl.tasks.embedded import prepare
from rl.tasks.embedded.cache import default_cache_dir
from rl.tasks.embedded.prepare import MARKER, MAX_NEW_TOKENS, Recipe, prepare_embedded_default
from tests.testing import tolerances
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
    assert sorted(path.name for path in workdir.iterdir()) == ["data", "model"]


def test_recorded_greedy_accuracy_is_the_models_on_the_validation_split(tmp_path):
    """The warm-up's recorded `val_accuracy` against an independent count: each validation prompt of the job's file
    decoded alone by an argmax loop (no batch, no padding, no `generate`), its response scored as the integer after
    the last `####` against the row's answer. On the default recipe's model (from the per-user cache the embedded
    job's targets share; the few-step model above answers none right, so it could not tell a wrong count from a
    right one). A prompt whose decoding meets a near tie (top two logits within twice `tolerances.logprob_gap`:
    the warm-up's batched, left-padded decoding may take the other token) counts as undecided."""
    job = prepare_embedded_default(tmp_path, log=None, cache_dir=default_cache_dir())
    model = AutoModelForCausalLM.from_pretrained(job.model_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(job.model_path)
    rows = load_prompt_dataset([job.val_data])
    right = undecided = 0
    for row in rows:
        answer, near_tie = _greedy_answer(model, tokenizer, row)
        undecided += near_tie
        right += not near_tie and answer == int(row.answer)
    recorded = round(job.metrics["val_accuracy"] * len(rows))
    print(f"val_accuracy {job.metrics['val_accuracy']}: {right} right, {undecided} undecided of {len(rows)}")
    assert job.metrics["val_accuracy"] == recorded / len(rows)  # a count of whole rows
    assert right <= recorded <= right + undecided, (recorded, right, undecided)


@torch.no_grad()
def _greedy_answer(model, tokenizer, row) -> tuple[int | None, bool]:
    """(the integer after the last `####` of the row's greedy response or None, whether a step met a near tie)."""
    messages = [{"role": message.role, "content": message.content} for message in row.prompt]
    step = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                         return_dict=True)["input_ids"]
    response, cache, near_tie = [], None, False
    for _ in range(MAX_NEW_TOKENS):
        out = model(input_ids=step, past_key_values=cache, use_cache=True)
        logits, cache = out.logits[0, -1], out.past_key_values
        first, second = logits.topk(2).values.tolist()
        near_tie |= first - second <= 2 * tolerances.logprob_gap(model.config, logits,
                                                                  model.config.max_position_embeddings)
        token = int(logits.argmax())
        if token == tokenizer.eos_token_id:
            break
        response.append(token)
        step = torch.tensor([[token]])
    text = tokenizer.decode(response, skip_special_tokens=True)
    found = re.match(r"\s*(-?\d+)", text.rsplit("####", 1)[1]) if "####" in text else None
    return (int(found.group(1)) if found else None), near_tie


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
