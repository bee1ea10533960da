"""Every kind of the run's Ray actors, failing for real in its construction (or its model's load) and in a call:
the line the launcher ends with names the actor (what it is, its class and pid), the method, the exception's type
and message, and the file in the run directory that holds the whole traceback. One Ray cluster for all of them;
the launcher's own wiring of these lines is `test_actor_faults.py`."""

from __future__ import annotations

import os
import re
import shutil
from types import SimpleNamespace

import pytest
import ray
import torch

from rl.backends.base import ModelSpec
from rl.backends.worker import TrainingWorker
from rl.core.generation import SamplingParams
from rl.core.packing import pack_sequences
from rl.trainer.loop import Trainer
from rl.trainer.rewards.reward_models import RewardModelActor
from rl.trainer.rollout.engines import EngineActor
from rl.trainer.run import FAILURE_FILE, _actor_failure, _actor_lost
from rl.trainer.workers.restarts import WORKER
from tests.testing.ray_cluster import shared_ray_address
from tests.testing.tiny_job import make_tiny_job

NO_WEIGHTS = r"OSError: .*(model\.safetensors|pytorch_model\.bin).*"


@pytest.fixture(scope="module")
def cluster():
    ray.init(address=shared_ray_address())
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job"))).model_path


@pytest.fixture(scope="module")
def weightless(model_path, tmp_path_factory):
    """The tiny model's folder without its weights (what an interrupted download leaves)."""
    folder = tmp_path_factory.mktemp("weightless")
    for name in os.listdir(model_path):
        if not name.endswith((".safetensors", ".bin", ".json.index")):
            shutil.copy(os.path.join(model_path, name), folder / name)
    return str(folder)


def line_of(call, run_dir) -> str:
    os.makedirs(run_dir, exist_ok=True)
    with pytest.raises((ray.exceptions.RayActorError, ray.exceptions.RayTaskError)) as caught:
        ray.get(call, timeout=120)
    line = _actor_failure(None, caught.value, str(run_dir))
    assert line is not None, str(caught.value)
    return line


def assert_line(line: str, run_dir, kind: str, cls: str, how: str, raised: str) -> None:
    """`how`: "died in its construction" or "failed in METHOD()"; `raised`: the exception's line, a regex."""
    path = os.path.join(str(run_dir), FAILURE_FILE)
    assert re.fullmatch(rf"{kind} \({cls}, pid \d+\) {re.escape(how)}: {raised} \(traceback: {re.escape(path)}\)",
                        line), line
    with open(path, encoding="utf-8") as f:
        saved = f.read()
    assert 'File "' in saved and re.search(raised, saved), saved[-2000:]


def test_generation_engine(cluster, model_path, weightless, tmp_path):
    engine = ray.remote(EngineActor)
    broken = engine.remote("hf", weightless, {})
    assert_line(line_of(broken.where.remote(), tmp_path / "a"), tmp_path / "a", "a generation engine", "EngineActor",
                "died in its construction", NO_WEIGHTS)
    live = engine.remote("hf", model_path, {})
    params = SamplingParams(n=1, temperature=1.0, max_new_tokens=2, seed=0)
    out_of_vocabulary = [[1, 10**6]]
    assert_line(line_of(live.generate_versioned.remote(out_of_vocabulary, params), tmp_path / "b"), tmp_path / "b",
                "a generation engine", "EngineActor", "failed in generate_versioned()",
                r"ValueError: prompts\[0\] holds token id 1000000, outside the model.s vocab .*")
    ray.kill(live)


def spec(path: str, role: str = "policy") -> ModelSpec:
    return ModelSpec(path=path, role=role, temperature=1.0)


def test_training_worker(cluster, model_path, weightless, tmp_path):
    """A training worker's models load in `setup` (its construction only records its rank): a missing model, then a
    forward over a token the vocabulary does not hold."""
    worker = ray.remote(TrainingWorker)
    broken = worker.remote(0, 1, 0)
    host, port = ray.get(broken.host_rendezvous.remote(1))
    call = broken.setup.remote(host, port, "fsdp", spec(weightless), None)
    assert_line(line_of(call, tmp_path / "a"), tmp_path / "a", "a training worker", "TrainingWorker",
                "failed in setup()", NO_WEIGHTS)
    ray.kill(broken)
    live = worker.remote(0, 1, 0)
    host, port = ray.get(live.host_rendezvous.remote(1))
    ray.get(live.setup.remote(host, port, "fsdp", spec(model_path), None), timeout=120)
    batch = pack_sequences([{"input_ids": torch.tensor([1, 2, 10**6]), "loss_mask": torch.tensor([0, 1, 1]).bool(),
                             "advantages": torch.zeros(3), "old_logprobs": torch.zeros(3)}])
    assert_line(line_of(live.logprobs.remote([batch]), tmp_path / "b"), tmp_path / "b", "a training worker",
                "TrainingWorker", "failed in logprobs()", r"IndexError: .*")
    ray.kill(live)


def test_a_survivor_whose_peer_died_reports_the_dead_one(cluster, model_path, tmp_path):
    """Two ranks in one group. An exception of a live rank among live peers is its own (no recovery: a new start
    would raise it again). Once rank 1 is killed, rank 0's next collective fails, and that error can reach the
    driver before rank 1's death does: it is rank 1's loss, a training worker to recover."""
    worker = ray.remote(TrainingWorker)
    ranks = [worker.remote(rank, 2, 0) for rank in range(2)]
    host, port = ray.get(ranks[0].host_rendezvous.remote(2))
    ray.get([rank.setup.remote(host, port, "fsdp", spec(model_path), None) for rank in ranks], timeout=120)
    run = SimpleNamespace(actors=lambda: [(rank, f"training worker rank {i}") for i, rank in enumerate(ranks)],
                          actor_names=dict)
    run.dead_actor = lambda: Trainer.dead_actor(run)
    batch = pack_sequences([{"input_ids": torch.tensor([1, 2, 10**6]), "loss_mask": torch.tensor([0, 1, 1]).bool(),
                             "advantages": torch.zeros(3), "old_logprobs": torch.zeros(3)}])
    calls = [rank.logprobs.remote([batch]) for rank in ranks]
    with pytest.raises(ray.exceptions.RayTaskError) as own:
        ray.get(calls[0], timeout=120)
    assert _actor_lost(run, own.value, str(tmp_path)) is None
    ray.kill(ranks[1], no_restart=True)
    with pytest.raises(ray.exceptions.RayTaskError) as peer:
        ray.get(ranks[0].full_state_dict.remote(), timeout=120)
    what, kind = _actor_lost(run, peer.value, str(tmp_path))
    assert kind == WORKER
    assert re.fullmatch(r"training worker rank 1 died \(\w+ in a peer\)", what), what
    ray.kill(ranks[0])


@pytest.fixture(scope="module")
def classifier(model_path, tmp_path_factory):
    """The tiny model's shape with a one-label score head, and its tokenizer."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(model_path, num_labels=1)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    folder = tmp_path_factory.mktemp("classifier")
    LlamaForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_reward_model(cluster, weightless, classifier, tmp_path):
    """The sequence classifier of trainer.reward: a causal LM where a classifier belongs, then a call with more
    prompts than responses."""
    actor = ray.remote(RewardModelActor)
    broken = actor.remote("reward_model", {"model": {"path": weightless}, "batch_size": 2})
    assert_line(line_of(broken.score.remote(["a"], ["b"], ["c"]), tmp_path / "a"), tmp_path / "a", "a reward model",
                "RewardModelActor", "died in its construction",
                r"ValueError: trainer\.reward\.model\.path: .* is not a sequence-classification model .*")
    live = actor.remote("reward_model", {"model": {"path": classifier}, "batch_size": 2})
    assert_line(line_of(live.score.remote(["a", "b"], ["c"], ["d", "e"]), tmp_path / "b"), tmp_path / "b",
                "a reward model", "RewardModelActor", "failed in score()",
                r"ValueError: got 2 prompts but 1 responses; give one response per prompt")
    ray.kill(live)
