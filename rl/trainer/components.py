"""Builds what one run needs from its config: prompts, tokenizer, generation engine and the worker group."""

from __future__ import annotations

import dataclasses
import os

import torch

from rl.backends.base import ModelSpec
from rl.core.data import PromptRecord, load_prompt_dataset
from rl.core.generation import SamplingParams, build_engine
from rl.trainer.worker_group import WorkerGroup


def encode_prompt(tokenizer, record: PromptRecord, max_length: int) -> list[int]:
    """Chat prompts through the tokenizer's template; the last `max_length` tokens are kept."""
    if record.is_chat:
        text = tokenizer.apply_chat_template(list(record.messages()), add_generation_prompt=True, tokenize=False)
    else:
        text = record.prompt
    return tokenizer(text, add_special_tokens=False)["input_ids"][-max_length:]


def sampling_params(gen_cfg, seed: int, evaluation: bool = False) -> SamplingParams:
    if evaluation:
        return SamplingParams(n=gen_cfg.eval_n_samples_per_prompt, temperature=gen_cfg.eval_temperature,
                              top_p=1.0, top_k=-1, max_new_tokens=gen_cfg.max_generate_length, seed=seed)
    return SamplingParams(n=gen_cfg.n_samples_per_prompt, temperature=gen_cfg.temperature, top_p=gen_cfg.top_p,
                          top_k=gen_cfg.top_k, max_new_tokens=gen_cfg.max_generate_length, seed=seed)


def load_datasets(cfg, train_paths: list[str], val_paths: list[str]):
    keys = {"prompt_key": cfg.data.prompt_key, "answer_key": cfg.data.answer_key}
    train = load_prompt_dataset(train_paths, **keys)
    val = load_prompt_dataset(val_paths, **keys) if val_paths else None
    return train, val


def make_engine(cfg, model_path: str, tokenizer):
    """The generation engine in the driver process: on the first GPU when there is one (colocated with the training
    workers: the trainer offloads it to host memory while they work), else on the CPU."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return build_engine(cfg.generator.backend, model_path, tokenizer, device=device)


def backend_options(cfg, role: str) -> dict:
    """The strategy's own block for one model: `megatron_config` (policy and reference share the layout) or
    DeepSpeed's train/eval dict; the other strategies read only the common ModelSpec fields."""
    if cfg.trainer.strategy == "megatron":
        return dataclasses.asdict(cfg.trainer.policy.megatron_config)
    return dict(cfg.deepspeed_config.train if role == "policy" else cfg.deepspeed_config.eval)


def model_specs(cfg, model_path: str) -> tuple[ModelSpec, ModelSpec | None]:
    trainer, opt = cfg.trainer, cfg.trainer.policy.optimizer_config
    fsdp = trainer.policy.fsdp_config
    policy = ModelSpec(
        path=model_path, role="policy", temperature=cfg.generator.temperature,
        gradient_checkpointing=trainer.gradient_checkpointing, cpu_offload=fsdp.cpu_offload,
        reshard_after_forward=fsdp.reshard_after_forward, fsdp_size=fsdp.fsdp_size, lr=opt.lr,
        weight_decay=opt.weight_decay, betas=tuple(opt.betas), max_grad_norm=opt.max_grad_norm,
        lr_warmup_steps=opt.lr_warmup_steps, backend_options=backend_options(cfg, "policy"),
        kernels=trainer.kernels,
    )
    if not trainer.algorithm.use_kl_loss:
        return policy, None
    ref_fsdp = trainer.ref.fsdp_config
    ref = ModelSpec(path=model_path, role="ref", temperature=cfg.generator.temperature,
                    cpu_offload=ref_fsdp.cpu_offload, reshard_after_forward=ref_fsdp.reshard_after_forward,
                    fsdp_size=ref_fsdp.fsdp_size, backend_options=backend_options(cfg, "ref"),
                    kernels=trainer.kernels)
    return policy, ref


def make_worker_group(cfg, model_path: str, world_size: int) -> WorkerGroup:
    cores = os.cpu_count() or 1
    threads = 1 if torch.cuda.is_available() else max(1, cores // world_size)
    group = WorkerGroup(world_size, seed=cfg.trainer.seed, threads_per_worker=threads)
    policy, ref = model_specs(cfg, model_path)
    group.setup(cfg.trainer.strategy, policy, ref)
    return group
