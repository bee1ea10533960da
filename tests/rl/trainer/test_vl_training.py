"""The embedded visual job through the launcher as a user runs it (`trainer.policy.model.path=embedded-vl`, its data
`[embedded-vl]`, its own settings; fsdp2, the hf engine in the driver): its tiny Qwen2-VL, warmed up by an
`rl.launch.sft` run on image rows (once per machine, cached), trains its 40 GRPO steps. Images reach every part or
the run could not go on (a placeholder without its image stops the forward); the checks: the warm-up's SFT run
lowered its loss and left a careless model, GRPO raises greedy validation accuracy by >= 0.3 (the job's seed 42:
+0.42; seeds 1, 2, 3: +0.72, +0.53, +0.50, seed 4 only +0.12: README), the vision tower's weights in the step-40
export all moved from the warmed-up ones (only image sequences give it a gradient), and the export loads in
transformers with its processor."""

import json

import pytest
import torch
from transformers import AutoModelForImageTextToText

from rl.core.processors import load_processor
from rl.trainer.state.metrics import read_metrics
from tests.testing.tiny_job import run_train

STEPS = 40


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("vl") / "run"
    run_train(str(run_dir), ["trainer.policy.model.path=embedded-vl", "data.train_data=[embedded-vl]",
                             "data.val_data=[embedded-vl]", f"trainer.eval_interval={STEPS}",
                             f"trainer.hf_save_interval={STEPS}"], check=True)
    return run_dir / "embedded-vl" / "model", run_dir


def test_the_warm_up_is_an_sft_run_that_left_a_careless_model(run):
    model, _ = run
    metrics = json.loads((model / "embedded.json").read_text())["metrics"]
    assert metrics["warmup_loss_last"] < metrics["warmup_loss_first"] - 2.0, metrics
    assert metrics["val_accuracy"] < 0.5, "careless: it skips the last quadrant on most problems with squares there"


def test_grpo_raises_greedy_validation_accuracy(run):
    _, run_dir = run
    accuracy = {row["step"]: row["val_accuracy"] for row in read_metrics(str(run_dir / "metrics.jsonl"))
                if "val_accuracy" in row}
    assert accuracy[STEPS] - accuracy[0] >= 0.3, accuracy


def test_the_vision_tower_trains_and_the_export_loads_with_its_processor(run):
    model, run_dir = run
    rows = {row["step"]: row for row in read_metrics(str(run_dir / "metrics.jsonl"))}
    assert rows[1]["grad_norm"] > 0
    initial = AutoModelForImageTextToText.from_pretrained(str(model)).state_dict()
    export = run_dir / "exports" / f"global_step_{STEPS}"
    trained = AutoModelForImageTextToText.from_pretrained(str(export)).state_dict()
    assert set(trained) == set(initial)
    visual = [name for name in initial if name.startswith("model.visual.")]
    assert visual and all(not torch.equal(trained[name], initial[name]) for name in visual), "every vision weight moved"
    assert load_processor(str(export)).image_processor.to_dict() == load_processor(str(model)).image_processor.to_dict()


def test_engine_actors_sample_with_each_prompts_images(run):
    """Engines of their own (`trainer.placement.colocate_all=false`): the prompts and each prompt's images split
    between two hf engine actors sample what the hf engine in this process samples (greedy, same weights), called
    directly and through the rollout queue of `trainer.fully_async` (which keeps a batch's images with it); a seeded
    call's shares sample with seeds of their own."""
    import ray

    from rl.core.data import BatchPosition, PromptBatch, load_prompt_dataset
    from rl.core.generation import SamplingParams
    from rl.core.generation.engine import build_engine
    from rl.trainer.rollout.engines import RemoteEngines
    from rl.trainer.rollout.image_prompts import encode_with_images
    from rl.trainer.rollout.rollout_queue import RolloutQueue, SingleTurnJobs
    from tests.testing.ray_cluster import shared_ray_address

    model, run_dir = run
    processor = load_processor(str(model))
    records = load_prompt_dataset([run_dir / "embedded-vl" / "data" / "validation.parquet"])[:5]
    prompts, images = zip(*(encode_with_images(processor, record) for record in records), strict=True)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=16)
    want = build_engine("hf", str(model), str(model), device="cpu").generate(list(prompts), params,
                                                                              images=list(images))
    ray.init(address=shared_ray_address(), log_to_driver=False)
    try:
        engines = RemoteEngines("hf", str(model), 2, {"device": "cpu"}, lambda i: {"num_cpus": 0})
        got = engines.generate(list(prompts), params, images=list(images))
        batch = PromptBatch(tuple(records), BatchPosition(0, 0), BatchPosition(0, len(records)))
        queue = RolloutQueue(SingleTurnJobs(engines), lambda: batch, lambda _: (list(prompts), list(images)),
                             lambda step: params, max_staleness_steps=0)
        queue.start(1, engine_version=0)
        queue.fill(1)
        queued = queue.take(1)[1]
        # one prompt for each engine, one seed for the call: each engine's share samples with a seed of its own
        twice = engines.generate([prompts[0]] * 2, SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=2),
                                 images=[images[0]] * 2)
    finally:
        ray.shutdown()
    expected = [(r.prompt_index, r.response_ids) for r in want]
    assert [(r.prompt_index, r.response_ids) for r in got] == expected
    assert [(r.prompt_index, r.response_ids) for r in queued] == expected
    assert all(r.images is not None for r in got + queued), "each rollout carries its prompt's images to training"
    assert [r.response_ids for r in twice if r.prompt_index == 0] != [r.response_ids for r in twice
                                                                       if r.prompt_index == 1]
