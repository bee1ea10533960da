"""Builds what one run needs from its config: prompts, tokenizer, generation engine and the worker group."""

from __future__ import annotations

import dataclasses
import os

import torch

from rl.backends.base import ModelSpec
from rl.backends.registry import STRATEGIES
from rl.core.data import PromptRecord, load_prompt_dataset
from rl.core.generation import SamplingParams, build_engine
from rl.trainer.engines import RemoteEngines
from rl.trainer.placement import Placement, machine_cores, make_plan
from rl.trainer.worker_group import WorkerGroup


def encode_prompt(tokenizer, record: PromptRecord, max_length: int) -> list[int]:
    """Chat prompts through the tokenizer's template; the last `max_length` tokens are kept."""
    if record.is_chat:
        text = tokenizer.apply_chat_template(list(record.messages()), add_generation_prompt=True, tokenize=False)
    else:
        text = record.prompt
    return tokenizer(text, add_special_tokens=False)["input_ids"][-max_length:]


def sampling_params(gen_cfg, seed: int, evaluation: bool = False) -> SamplingParams:
    common = {"max_new_tokens": gen_cfg.max_generate_length, "seed": seed, "stop": tuple(gen_cfg.stop or ())}
    if evaluation:
        return SamplingParams(n=gen_cfg.eval_n_samples_per_prompt, temperature=gen_cfg.eval_temperature,
                              top_p=1.0, top_k=-1, **common)
    return SamplingParams(n=gen_cfg.n_samples_per_prompt, temperature=gen_cfg.temperature, top_p=gen_cfg.top_p,
                          top_k=gen_cfg.top_k, **common)


def load_datasets(cfg, train_paths: list[str], val_paths: list[str]):
    keys = {"prompt_key": cfg.data.prompt_key, "answer_key": cfg.data.answer_key}
    train = load_prompt_dataset(train_paths, **keys)
    val = load_prompt_dataset(val_paths, **keys) if val_paths else None
    return train, val


ACTOR_ENV = {"RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}


def make_placement(cfg) -> Placement:
    return Placement(make_plan(cfg, torch.cuda.is_available(), machine_cores()), ACTOR_ENV)


def make_engine(cfg, model_path: str, tokenizer, placement: Placement):
    """Colocated `hf`: the engine in the driver process, on the first GPU when there is one (the trainer offloads
    it to host memory while the workers use the device), else on the CPU. Otherwise engine actors
    (`engines.RemoteEngines`): colocated vLLM engines share the workers' devices; with colocate_all=false every
    engine sits in a bundle of its own."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = cfg.generator
    if gen.backend == "hf" and not placement.plan.engines:
        return build_engine("hf", model_path, tokenizer, device=device)
    kwargs = dict(device=device)
    if gen.backend == "vllm":
        kwargs.update(tensor_parallel_size=gen.inference_engine_tensor_parallel_size,
                      gpu_memory_utilization=gen.gpu_memory_utilization,
                      enable_prefix_caching=gen.enable_prefix_caching,
                      max_num_batched_tokens=gen.max_num_batched_tokens, max_num_seqs=gen.max_num_seqs,
                      max_model_len=gen.max_prompt_length + gen.max_generate_length, seed=cfg.trainer.seed)
    # engines of their own, or sharing the workers' devices (sleep mode frees them while the workers train)
    options = placement.engine_options if placement.plan.engines else placement.colocated_engine_options
    return RemoteEngines(gen.backend, model_path, gen.num_inference_engines, kwargs, options)


def model_specs(cfg, model_path: str) -> tuple[ModelSpec, ModelSpec | None]:
    """What each worker builds: the policy, and the reference when the KL loss needs one; the strategy supplies its
    own settings for each (`StrategyConfig.backend_options`)."""
    trainer, opt, strategy = cfg.trainer, cfg.trainer.policy.optimizer_config, STRATEGIES.get(cfg.trainer.strategy)
    common = {"path": model_path, "temperature": cfg.generator.temperature, "kernels": trainer.kernels,
              "fused_kernels": trainer.policy.use_fused_kernels,
              "fused_chunk_size": trainer.policy.fused_kernel_chunk_size,
              "sequence_parallel_size": trainer.policy.sequence_parallel_size}
    lora = trainer.policy.model.lora
    policy = ModelSpec(
        role="policy", gradient_checkpointing=trainer.gradient_checkpointing, lr=opt.lr,
        weight_decay=opt.weight_decay, betas=tuple(opt.betas), max_grad_norm=opt.max_grad_norm,
        lr_warmup_steps=opt.lr_warmup_steps, backend_options=strategy.backend_options(cfg, "policy"),
        lora=dataclasses.asdict(lora) if lora.rank > 0 else None, **common)
    if not trainer.algorithm.use_kl_loss or policy.lora:  # a LoRA policy is its own reference (adapters off)
        return policy, None
    return policy, ModelSpec(role="ref", backend_options=strategy.backend_options(cfg, "ref"), **common)


def make_worker_groups(cfg, model_path: str, placement: Placement) -> tuple[WorkerGroup, WorkerGroup | None]:
    """The policy's workers (holding the reference too, unless it has a group of its own), and that group."""
    plan, backend = placement.plan, STRATEGIES.get(cfg.trainer.strategy).backend
    policy, ref = model_specs(cfg, model_path)
    group = WorkerGroup(plan.workers, seed=cfg.trainer.seed, options=_options(placement.worker_options, plan))
    group.setup(backend, policy, None if plan.ref_workers else ref)
    if not plan.ref_workers:
        return group, None
    ref_group = WorkerGroup(plan.ref_workers, seed=cfg.trainer.seed,
                            options=_options(placement.ref_worker_options, plan))
    ref_group.setup(backend, None, ref)
    return group, ref_group


def _options(placed, plan):
    """Ray options of a worker rank: its bundle, and its cores or thread count."""
    if plan.worker_cores:
        return placed  # pinned to the cores the engines leave
    threads = 1 if torch.cuda.is_available() else max(1, (os.cpu_count() or 1) // (plan.workers + plan.ref_workers))
    return lambda rank: {**placed(rank), "runtime_env": {"env_vars": {**ACTOR_ENV, "OMP_NUM_THREADS": str(threads)}}}
