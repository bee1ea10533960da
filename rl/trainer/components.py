"""Builds what one run needs from its config: prompts, tokenizer and generation engine (the workers:
`rl.trainer.workers.worker_start`)."""

from __future__ import annotations

import torch

from rl.core.data import PromptRecord, load_prompt_dataset, load_prompt_template
from rl.core.data.splitting import joined, split_validation
from rl.core.generation import SamplingParams, build_engine
from rl.trainer.rollout.engines import RemoteEngines
from rl.trainer.rollout.prompt_encoding import render_ids, truncate
from rl.trainer.workers.placement import Placement


def encode_prompt(tokenizer, record: PromptRecord, max_length: int, truncation: str = "left") -> list[int]:
    """One prompt as the trainer encodes it (`prompt_encoding`), without its warnings and counts."""
    return truncate(render_ids(tokenizer, record), max_length, truncation)


def sampling_params(gen_cfg, seed: int, evaluation: bool = False) -> SamplingParams:
    common = {"max_new_tokens": gen_cfg.max_generate_length, "seed": seed, "stop": tuple(gen_cfg.stop or ())}
    if evaluation:
        return SamplingParams(n=gen_cfg.eval_n_samples_per_prompt, temperature=gen_cfg.eval_temperature,
                              top_p=1.0, top_k=-1, **common)
    return SamplingParams(n=gen_cfg.n_samples_per_prompt, temperature=gen_cfg.temperature, top_p=gen_cfg.top_p,
                          top_k=gen_cfg.top_k, **common)


def load_datasets(cfg, train_paths: list[str], val_paths: list[str]):
    from rl.trainer.multi_turn.row_environments import env_class_check

    keys = {"prompt_key": cfg.data.prompt_key, "answer_key": cfg.data.answer_key,
            "env_class_check": env_class_check(cfg),
            "template": load_prompt_template(cfg.data.prompt_template_file, cfg.data.system_prompt_file)}
    train = load_prompt_dataset(train_paths, **keys)
    val = load_prompt_dataset(val_paths, **keys) if val_paths else None
    if cfg.data.val_split_size:
        train, held_out = split_validation(train, cfg.data.val_split_size, cfg.data.val_split_seed)
        val = joined(held_out, val)
    return train, val


def image_processor(model_path: str):
    """A vision-language model's processor (its prompts' images are prepared with it), None for a text model."""
    from transformers import AutoConfig

    from rl.core.model_class import is_vision_language

    if not is_vision_language(AutoConfig.from_pretrained(model_path)):
        return None
    from rl.core.processors import load_processor

    return load_processor(model_path)


def make_engine(cfg, model_path: str, tokenizer, placement: Placement):
    """Colocated `hf`: the engine in the driver process, on the first GPU when there is one (the trainer offloads
    it to host memory while the workers use the device), else on the CPU. Otherwise engine actors
    (`engines.RemoteEngines`): colocated vLLM engines share the workers' devices; with colocate_all=false every
    engine sits in a bundle of its own."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = cfg.generator
    exact = {"exact": True} if cfg.trainer.exact_on_policy else {}  # the trainer's arithmetic (checks_exact: hf only)
    if gen.backend == "hf" and not placement.plan.engines:
        return build_engine("hf", model_path, tokenizer, device=device, **exact)
    kwargs = dict(device=device, **exact)
    if gen.backend == "vllm":
        print("vllm engines' KV cache: " + (
            f"{gen.kv_cache_memory_bytes / (1 << 20):.1f} MiB each (generator.kv_cache_memory_bytes; vLLM does not "
            "use gpu_memory_utilization then)" if gen.kv_cache_memory_bytes is not None else
            f"what gpu_memory_utilization={gen.gpu_memory_utilization} of each engine's "
            f"{'device' if device == 'cuda' else 'NUMA node'} leaves (generator.kv_cache_memory_bytes is null)"))
        kwargs.update(tensor_parallel_size=gen.inference_engine_tensor_parallel_size,
                      gpu_memory_utilization=gen.gpu_memory_utilization,
                      kv_cache_memory_bytes=gen.kv_cache_memory_bytes,
                      enable_prefix_caching=gen.enable_prefix_caching,
                      max_num_batched_tokens=gen.max_num_batched_tokens, max_num_seqs=gen.max_num_seqs,
                      max_model_len=gen.max_prompt_length + gen.max_generate_length, seed=cfg.trainer.seed,
                      own_process=True,  # each engine actor holds its engine for its life
                      engine_kwargs=dict(gen.engine_init_kwargs))
    # engines of their own, or sharing the workers' devices (sleep mode frees them while the workers train)
    options = placement.engine_options if placement.plan.engines else placement.colocated_engine_options
    asynchronous = cfg.trainer.fully_async
    return RemoteEngines(gen.backend, model_path, gen.num_inference_engines, kwargs, options,
                         asynchronous.partial_rollout_tokens if asynchronous.enabled else 0)
