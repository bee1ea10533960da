"""A vision-language model's (Qwen2-VL's and Qwen2.5-VL's) logprobs over a packed (and a padded) batch of (image,
text) sequences against transformers' own forward of each sequence alone, as its processor prepares it (the model
computing its own multimodal rotary positions): no token sees another sequence or another sequence's image, and a
text-only sequence beside image ones scores as it does alone. Oracle: the unpacked HF forward; bound: the float32
reductions of the vision tower and the decoder (`tests.testing.tolerances`)."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from rl.backends.hf_forward import batch_logprobs
from rl.backends.hf_model import load_causal_lm
from rl.core.images import ImageInputs
from rl.core.packing import pack_sequences, pad_sequences
from rl.tasks.embedded_vl.model import build_model, build_processor, save_vl_model, tiny_vl_config
from tests.testing import tolerances

# (images as (height, width, seed), question, answer); a seed of None draws a blank image
CASES = [
    ([(56, 56, 1)], "How many squares?", "#### 3"),
    ([(56, 84, 2)], "What is 2 + 3?", "#### 5"),
    ([], "What is 12 + 30?", "#### 42"),
    ([(28, 56, 3), (84, 56, None)], "How many squares?", "#### 12"),
]


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def checkpoint(request, tmp_path_factory):
    """The embedded visual task's tiny model in each family (Qwen2.5-VL: window attention in the vision tower)."""
    processor = build_processor()
    path = save_vl_model(build_model(tiny_vl_config(processor.tokenizer, request.param), seed=0), processor,
                         tmp_path_factory.mktemp(request.param) / "model")
    return path, processor


def image(height: int, width: int, seed: int | None) -> Image.Image:
    if seed is None:
        return Image.new("RGB", (width, height), (255, 255, 255))
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def encoded(processor, case) -> dict:
    """The processor's tensors for one whole sequence, and its loss mask (the answer's tokens and the eos)."""
    shapes, question, answer = case
    content = [{"type": "image"} for _ in shapes] + [{"type": "text", "text": question}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                           add_generation_prompt=True)
    images = [image(*shape) for shape in shapes] or None
    whole = processor(text=[prompt + answer + processor.tokenizer.eos_token], images=images, return_tensors="pt")
    prompt_length = processor(text=[prompt], images=images, return_tensors="pt")["input_ids"].shape[1]
    ids = whole["input_ids"][0]
    loss_mask = torch.arange(len(ids)) >= prompt_length
    return {**whole, "loss_mask": loss_mask}


def sequence(item: dict) -> dict:
    images = (ImageInputs(item["pixel_values"], item["image_grid_thw"]) if "pixel_values" in item else None)
    return {"input_ids": item["input_ids"][0], "loss_mask": item["loss_mask"], "images": images}


def alone(model, item: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs of each token given the ones before, aligned with the target, 0 on the first; the logits)."""
    inputs = {key: value for key, value in item.items() if key != "loss_mask"}
    with torch.no_grad():
        logits = model(**inputs).logits[0]
    lp = torch.log_softmax(logits[:-1].double(), -1).gather(-1, item["input_ids"][0, 1:, None])[:, 0]
    return torch.cat([lp.new_zeros(1), lp]).float(), logits


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_logprobs_equal_each_sequence_alone(checkpoint, layout):
    path, processor = checkpoint
    items = [encoded(processor, case) for case in CASES]
    build = pack_sequences if layout == "packed" else pad_sequences
    batch = build([sequence(item) for item in items], pad_token_id=processor.tokenizer.pad_token_id)
    trained = load_causal_lm(str(path), torch.device("cpu")).eval()  # the backends' loader (per-sequence attention)
    with torch.no_grad():
        got, _ = batch_logprobs(trained, batch, temperature=1.0, with_entropy=False)
    reference = AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32).eval()
    config = reference.config
    starts = batch.cu_seqlens[:-1].tolist()
    for item, start, case in zip(items, starts, CASES, strict=True):
        want, logits = alone(reference, item)
        mask = item["loss_mask"]
        length = len(mask)
        patches = int(item["image_grid_thw"].prod(-1).max()) if "image_grid_thw" in item else 0
        rtol = tolerances.network_rtol(
            tolerances.decoder_reductions(config.text_config, length)
            + (tolerances.vision_tower_reductions(config.vision_config, patches) if patches else []), torch.float32)
        tolerances.assert_within(got[start:start + length][mask], want[mask], rtol * float(logits.abs().max()),
                                 f"{layout} logprobs of {case[1]!r} with {len(case[0])} image(s)")
        assert int(mask.sum()) >= 3


def test_a_text_model_refuses_images(checkpoint, tmp_path):
    from rl.tasks.embedded.model import build_model as build_text_model
    from rl.tasks.embedded.model import save_pretrained_model, tiny_model_config
    from rl.tasks.embedded.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    text_path = save_pretrained_model(build_text_model(tiny_model_config(tokenizer), 0), tokenizer, tmp_path / "m")
    _, processor = checkpoint
    batch = pack_sequences([sequence(encoded(processor, CASES[0]))])
    with pytest.raises(ValueError, match="the batch has images, but LlamaForCausalLM is a text-only model"):
        batch_logprobs(load_causal_lm(str(text_path), torch.device("cpu")), batch, 1.0, False)


LR = 1e-2
ZERO3 = {"zero_optimization": {"stage": 3}}
LORA = dict(rank=4, alpha=8, dropout=0.0, target_modules=["all-linear"], exclude_modules=["o_proj"],
            init_method="gaussian", merge_on_export=False)
# case -> (strategy, backend options, what trains: the whole model, its language model, or LoRA adapters on it)
STRATEGIES = {"fsdp2": ("fsdp2", None, "whole"), "fsdp": ("fsdp", None, "whole"), "zero2": ("deepspeed", None, "whole"),
              "zero3": ("deepspeed", ZERO3, "whole"), "fsdp2-frozen-vision": ("fsdp2", None, "language"),
              "fsdp-frozen-vision": ("fsdp", None, "language"), "zero3-frozen-vision": ("deepspeed", ZERO3, "language"),
              "fsdp2-lora": ("fsdp2", None, "lora"), "fsdp-lora": ("fsdp", None, "lora")}


@pytest.fixture(scope="module")
def process_group():
    import torch.distributed as dist

    from rl.backends.dist import init_distributed

    yield init_distributed(0, 1, "127.0.0.1", 0)
    dist.destroy_process_group()


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_one_step_matches_plain_torch(checkpoint, process_group, strategy):
    """One GRPO step through each strategy against the same step of the plain transformers model with torch's
    AdamW, training the whole model (vision tower included), the language model alone
    (`trainer.policy.model.freeze_vision_tower`), or LoRA adapters on the language layers (PEFT's injection on the
    oracle, `exclude_modules` honoured beside the vision tower): the loss within the float32 bound of the forward,
    every trained weight within Adam's gap of the oracle's gradients (`tolerances.adam_gap`), every other weight
    bit for bit as loaded."""
    from rl.backends.base import ModelSpec
    from rl.backends.registry import build_backend
    from rl.core.algorithms import LossNormalizer, LossSettings
    from tests.testing.backend_steps import oracle_step

    path, processor = checkpoint
    name, options, trains = STRATEGIES[strategy]
    spec = ModelSpec(path=str(path), role="policy", temperature=1.0, lr=LR, weight_decay=0.0,
                     backend_options=options, bf16=False, freeze_vision_tower=trains == "language",
                     lora=LORA if trains == "lora" else None)
    backend = build_backend(name, spec, process_group)
    start = {key: value.clone() for key, value in backend.own_state_dict().items()} if trains == "lora" else None
    items = [encoded(processor, case) for case in CASES]
    g = torch.Generator().manual_seed(0)
    sequences = [{**sequence(item), "advantages": torch.randn(len(item["loss_mask"]), generator=g) * item["loss_mask"],
                  "old_logprobs": torch.zeros(len(item["loss_mask"]))} for item in items]
    batch = pack_sequences(sequences, pad_token_id=processor.tokenizer.pad_token_id)
    old, _ = backend.logprobs(batch)
    batch = batch.replace(old_logprobs=old)
    settings = LossSettings(use_kl_loss=False)
    normalizer = LossNormalizer.from_counts("token_mean", int(batch.loss_mask.sum()), len(CASES))
    got = backend.forward_backward(batch, settings, normalizer)
    backend.optimizer_step()
    after = backend.own_state_dict() if trains == "lora" else backend.full_state_dict()  # LoRA: adapters unmerged

    oracle = load_causal_lm(str(path), torch.device("cpu"))
    if trains == "language":
        oracle.model.visual.requires_grad_(False)
    if trains == "lora":
        from rl.backends.lora import add_lora

        add_lora(oracle, LORA, str(path))
        oracle.load_state_dict(start)  # the backend's randomly drawn adapters
    trainable = [p for p in oracle.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LR, weight_decay=0.0)
    names = {id(p): n for n, p in oracle.named_parameters()}
    grads = {}
    optimizer.register_step_pre_hook(lambda *_: grads.update({names[id(p)]: p.grad.clone() for p in trainable}))
    loss = oracle_step(oracle, batch, settings, normalizer, trainable, optimizer)

    config = oracle.config
    patches = max(int(item["image_grid_thw"].prod(-1).max()) for item in items if "image_grid_thw" in item)
    reductions = (tolerances.decoder_reductions(config.text_config, int(batch.seq_lengths.max()), batch.num_tokens)
                  + tolerances.vision_tower_reductions(config.vision_config, patches))
    rtol = tolerances.network_rtol(reductions, torch.float32)
    scale = float(batch.advantages[batch.loss_mask].abs().mean())
    assert got["loss"] == pytest.approx(loss, rel=rtol, abs=rtol * scale)
    assert set(after) == set(oracle.state_dict()), "every weight comes back under its HF (or PEFT) name"
    for key, value in oracle.state_dict().items():
        if key not in grads:
            assert torch.equal(after[key], value), f"{strategy} {key}: a frozen weight changed"
            continue
        bound = tolerances.adam_gap([grads[key]], [rtol * grads[key].abs().max()], LR)
        bound += 2 * tolerances.unit_roundoff(torch.float32) * value.abs().double()
        tolerances.assert_within(after[key], value, bound, msg=f"{strategy} {key}")
    visual = [key for key in grads if key.startswith("model.visual.")]
    if trains == "whole":
        assert visual and all(float(grads[key].abs().max()) > 0 for key in visual), "the vision tower trains"
        return
    assert not visual and grads, "the language model trains, the vision tower does not"
    if trains == "lora":
        assert all(".lora_" in key for key in grads), sorted(grads)
        adapted = {key.split(".lora_")[0].rsplit(".", 1)[-1] for key in grads}
        assert "q_proj" in adapted and "o_proj" not in adapted, f"exclude_modules is honoured: {sorted(adapted)}"


def test_hf_engine_samples_with_images_and_the_trainer_scores_them_alike(checkpoint):
    """The hf engine's sampled tokens and their logprobs, each prompt's images given once for its two samples,
    against the trainer's packed logprobs of the same (image, prompt + response) sequences; the vision tokens are
    never sampled, and the sampling logprobs are the model's renormalised over the other tokens."""
    from rl.backends.hf_forward import scored_logits
    from rl.core.generation import SamplingParams, build_engine

    path, processor = checkpoint
    engine = build_engine("hf", str(path), str(path), max_batch_size=5)  # rows of one prompt split across chunks
    prompts, images = [], []
    for item in (encoded(processor, (shapes, question, "")) for shapes, question, _ in CASES):
        prompt_length = int((~item["loss_mask"]).sum())
        prompts.append(item["input_ids"][0, :prompt_length].tolist())
        images.append(sequence(item)["images"])
    rollouts = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=3), images)
    assert [(r.prompt_index, r.sample_index) for r in rollouts] == [(p, s) for p in range(len(CASES)) for s in (0, 1)]
    batch = pack_sequences([{"input_ids": torch.tensor(r.prompt_ids + r.response_ids),
                             "loss_mask": torch.arange(len(r.prompt_ids) + len(r.response_ids)) >= len(r.prompt_ids),
                             "images": images[r.prompt_index]} for r in rollouts],
                           pad_token_id=processor.tokenizer.pad_token_id)
    trained = load_causal_lm(str(path), torch.device("cpu")).eval()
    with torch.no_grad():
        got, _ = batch_logprobs(trained, batch, temperature=1.0, with_entropy=False)
        logits = scored_logits(trained, batch).logits
    config = trained.config
    patches = max(int(entry.grid_thw.prod(-1).max()) for entry in images if entry is not None)
    rtol = tolerances.network_rtol(
        tolerances.decoder_reductions(config.text_config, int(batch.seq_lengths.max()))
        + tolerances.vision_tower_reductions(config.vision_config, patches), torch.float32)
    gap = rtol * float(logits.abs().max())
    raw = torch.tensor([lp for r in rollouts for lp in r.raw_logprobs])
    tolerances.assert_within(got[batch.loss_mask], raw, gap, "the engine's logprobs against the trainer's")
    # the image placeholders and markers are never sampled: the sampling distribution is the model's renormalised
    # over the other tokens, as a top-k mask renormalises it
    never = [config.image_token_id, config.video_token_id, config.vision_start_token_id, config.vision_end_token_id]
    assert not {token for r in rollouts for token in r.response_ids} & set(never)
    masked = torch.log_softmax(logits.double(), -1)[:, never].exp().sum(-1)
    sampled = torch.tensor([lp for r in rollouts for lp in r.rollout_logprobs], dtype=torch.float64)
    tolerances.assert_within(sampled, raw.double() - torch.log1p(-masked), 2 * gap, "the sampling distribution")
    assert sum(len(r.response_ids) for r in rollouts) >= len(rollouts)
