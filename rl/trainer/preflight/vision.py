"""What a vision-language policy (Qwen2-VL's family) needs from the rest of the config, checked before anything
starts. Images reach the model through the hf or the vllm engine (in the driver, or engine actors of their own with
`trainer.placement.colocate_all=false`; synchronous, or `trainer.fully_async` with whole calls) and the strategies
whose backends take them (`StrategyConfig.images`), single-turn, with the reference model, training the whole model
or its language model (`freeze_vision_tower`, LoRA); the parts that do not carry images yet are refused by their key,
and so are rows with images for a text model."""

from __future__ import annotations

from rl.core.config.strategies import STRATEGIES, local_model_config
from rl.tasks.jobs import EMBEDDED_VL


def model_kind(path: str) -> str | None:
    """A local model directory's architecture when it is a vision-language model (its config.json has a
    vision_config), else None; the embedded visual job's model is one."""
    if path == EMBEDDED_VL:
        return "Qwen2VLForConditionalGeneration, the embedded visual job's"
    config = local_model_config(path)
    if getattr(config, "vision_config", None) is None:
        return None
    return ", ".join(getattr(config, "architectures", None) or [str(getattr(config, "model_type", "?"))])


def vision_language_problems(cfg) -> list[str]:
    trainer, env = cfg.trainer, cfg.environment
    found = [f"{key}: {path} is a vision-language model ({kind}); only the policy may be one (the reference is the "
             "policy's own starting weights): point it at a text model or leave it unset"
             for key, path in (("trainer.ref.model.path", trainer.ref.model.path),
                               ("trainer.critic.model.path", trainer.critic.model.path))
             if path and (kind := model_kind(path))]
    kind = model_kind(trainer.policy.model.path)
    if kind is None:
        if trainer.policy.model.freeze_vision_tower:
            found.append(f"trainer.policy.model.freeze_vision_tower: is true, but trainer.policy.model.path "
                         f"{trainer.policy.model.path} is a text model (its config.json has no vision_config): "
                         "set it to false")
        return found
    what = f"trainer.policy.model.path is a vision-language model ({kind})"
    carrying = [name for name in STRATEGIES.names() if STRATEGIES.get(name).images]
    refused = [
        ("trainer.strategy", trainer.strategy not in carrying,
         f"is {trainer.strategy}; {what}, whose images only the backends of {', '.join(carrying)} take: pick one "
         "of them"),
        ("trainer.fully_async.partial_rollout_tokens", trainer.fully_async.partial_rollout_tokens > 0,
         f"is {trainer.fully_async.partial_rollout_tokens}; {what}, and partial rollouts continue prompts segment "
         "by segment, which does not carry images yet: set it to 0 (whole calls)"),
        ("environment.env_class", env.env_class is not None,
         f"is {env.env_class}; {what}, whose episodes are single-turn so far: leave it unset"),
        ("environment.agent_fn", env.agent_fn is not None,
         f"is set; {what}, and the agent endpoint takes no images yet: leave it unset"),
        ("trainer.policy.sequence_parallel_size", trainer.policy.sequence_parallel_size > 1,
         f"is {trainer.policy.sequence_parallel_size}; {what}, whose images and multimodal positions Ulysses does "
         "not split: set it to 1"),
        ("trainer.policy.use_fused_kernels", trainer.policy.use_fused_kernels,
         f"is true; {what}, and the fused loss has not been checked against it: set it to false"),
        ("trainer.algorithm.advantage_estimator", trainer.algorithm.advantage_estimator == "gae",
         f"is gae; {what}, and a critic made from it is not built yet: use a critic-free estimator such as grpo"),
    ]
    return found + [f"{key}: {message}" for key, bad, message in refused if bad]


def image_rows_problems(cfg, key: str, dataset) -> list[str]:
    """Rows with images for a text policy."""
    first = next((record for record in dataset if record.images), None)
    if first is None or model_kind(cfg.trainer.policy.model.path):
        return []
    rows = sum(1 for record in dataset if record.images)
    return [f"{key}: {first.where} has {len(first.images)} image(s) ({rows} row(s) with images), but "
            f"trainer.policy.model.path {cfg.trainer.policy.model.path} is a text model: point it at a "
            "vision-language model (Qwen2-VL, Qwen2.5-VL), or drop the image column"]


SHOWN_IMAGE_PROBLEMS = 5


def image_processor(path: str):
    """The policy's image processor, as its engine builds it (the embedded visual job's own for its model)."""
    if path == EMBEDDED_VL:
        from rl.tasks.embedded_vl.model import build_processor

        return build_processor().image_processor
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(path)


def image_size_problems(cfg, key: str, dataset) -> list[str]:
    """Images the policy's processor would refuse (Qwen2-VL's: an aspect ratio above 200), each named by its row,
    found from the images' headers before anything starts (the processor raises in the engine, after Ray)."""
    if not model_kind(cfg.trainer.policy.model.path) or not any(record.images for record in dataset):
        return []
    import io
    import sys

    from PIL import Image

    path = cfg.trainer.policy.model.path
    try:
        processor = image_processor(path)
    except (OSError, ValueError) as error:
        return [f"trainer.policy.model.path: {path} is a vision-language model, but its image processor does not "
                f"load ({type(error).__name__}: {str(error).splitlines()[0]}); {key} holds images: save the model's "
                "processor beside it (processor.save_pretrained, which writes preprocessor_config.json)"]
    settings = processor.to_dict()
    size = settings.get("size") or {}
    factor = settings.get("patch_size", 14) * settings.get("merge_size", 2)
    low = size.get("shortest_edge") or settings.get("min_pixels") or 56 * 56
    high = size.get("longest_edge") or settings.get("max_pixels") or 14 * 14 * 4 * 1280
    resize = getattr(sys.modules[type(processor).__module__], "smart_resize", None)
    if resize is None:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as resize
    found = []
    for record in dataset:
        for number, data in enumerate(record.images):
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
            try:
                resize(height, width, factor=factor, min_pixels=low, max_pixels=high)
            except ValueError as error:
                found.append(f"{key}: {record.where} image {number}: {width} x {height} pixels, which "
                             f"{type(processor).__name__} refuses ({error}); crop or pad it")
    if len(found) > SHOWN_IMAGE_PROBLEMS:
        more = len(found) - SHOWN_IMAGE_PROBLEMS
        found = [*found[:SHOWN_IMAGE_PROBLEMS], f"{key}: and {more} more image(s) the processor refuses"]
    return found
