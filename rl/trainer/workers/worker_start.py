"""Starting the training workers before the driver loads anything else: the actors' processes import and come up
while the driver imports the generation stack, reads the prompts and builds its engine; the models are built once
the model path is known (`setup_worker_groups`)."""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

import torch

from rl.backends.base import ModelSpec
from rl.backends.registry import STRATEGIES
from rl.trainer.workers.placement import Placement, machine_cores, make_plan, needs_reference
from rl.trainer.workers.worker_group import WorkerGroup

ACTOR_ENV = {"RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}


def make_placement(cfg) -> Placement:
    return Placement(make_plan(cfg, torch.cuda.is_available(), machine_cores()), ACTOR_ENV)


def optimizer_fields(opt, run_optimizer_steps: int) -> dict:
    """A ModelSpec's optimizer settings from an optimizer_config block; a decay without lr_decay_steps ends at the
    run's last optimizer step (`run_optimizer_steps`)."""
    return dict(lr=opt.lr, weight_decay=opt.weight_decay, betas=tuple(opt.betas), max_grad_norm=opt.max_grad_norm,
                lr_warmup_steps=opt.lr_warmup_steps, scheduler=opt.scheduler, min_lr=opt.min_lr,
                lr_decay_steps=opt.lr_decay_steps or run_optimizer_steps)


def run_optimizer_steps(cfg, role: str, training_steps: int) -> int:
    """The optimizer steps of a run of `training_steps` RL steps: each trains every mini-batch of its prompts
    update_epochs_per_batch times (the critic's mini-batches are critic_mini_batch_size prompts)."""
    trainer = cfg.trainer
    mini = trainer.policy_mini_batch_size
    if role == "critic":
        mini = trainer.critic_mini_batch_size or mini
    return training_steps * (trainer.train_batch_size // mini) * trainer.update_epochs_per_batch


def model_specs(cfg, model_path: str, ref_path: str | None = None,
                optimizer_steps: int = 0) -> tuple[ModelSpec, ModelSpec | None]:
    """What each worker builds: the policy, and the reference when a KL needs one (from `ref_path`, e.g. a
    distillation teacher, else the policy's starting weights); the strategy supplies its own settings for each
    (`StrategyConfig.backend_options`). `optimizer_steps`: the policy's optimizer steps in the whole run."""
    trainer, opt, strategy = cfg.trainer, cfg.trainer.policy.optimizer_config, STRATEGIES.get(cfg.trainer.strategy)
    common = {"path": model_path, "temperature": cfg.generator.temperature, "kernels": trainer.kernels,
              "fused_kernels": trainer.policy.use_fused_kernels,
              "fused_chunk_size": trainer.policy.fused_kernel_chunk_size,
              "sequence_parallel_size": trainer.policy.sequence_parallel_size, "bf16": trainer.bf16,
              "flash_attn": trainer.flash_attn}
    lora = trainer.policy.model.lora
    policy = ModelSpec(
        role="policy", gradient_checkpointing=trainer.gradient_checkpointing, **optimizer_fields(opt, optimizer_steps),
        backend_options=strategy.backend_options(cfg, "policy"),
        lora=dataclasses.asdict(lora) if lora.rank > 0 else None,
        freeze_vision_tower=trainer.policy.model.freeze_vision_tower, exact=trainer.exact_on_policy, **common)
    if not needs_reference(cfg) or (policy.lora and not ref_path):  # a LoRA policy is its own reference
        return policy, None
    return policy, ModelSpec(role="ref", backend_options=strategy.backend_options(cfg, "ref"),
                             **{**common, "path": ref_path or model_path})


class StartedWorkers(NamedTuple):
    placement: Placement
    group: WorkerGroup  # the policy's workers (holding the reference and the critic too, unless groups of their own do)
    ref_group: WorkerGroup | None  # the reference's workers, where the plan gives it workers of its own
    critic_group: WorkerGroup | None = None  # the critic's workers, where the plan gives it workers of its own


def start_workers(cfg) -> StartedWorkers:
    """The run's placement and its worker actors: started, not waited for."""
    placement = make_placement(cfg)
    print(f"placement: {placement.describe()}", flush=True)
    plan = placement.plan
    group = WorkerGroup(plan.workers, seed=cfg.trainer.seed, options=_options(placement.worker_options, plan))
    ref_group = (WorkerGroup(plan.ref_workers, seed=cfg.trainer.seed,
                             options=_options(placement.ref_worker_options, plan)) if plan.ref_workers else None)
    critic_group = (WorkerGroup(plan.critic_workers, seed=cfg.trainer.seed,
                                options=_options(placement.critic_worker_options, plan))
                    if plan.critic_workers else None)
    for each in (group, ref_group, critic_group):
        if each is not None:
            each.collective_timeout_s = cfg.trainer.collective_timeout_s
    return StartedWorkers(placement, group, ref_group, critic_group)


def critic_spec(cfg, critic_path: str | None, optimizer_steps: int = 0) -> ModelSpec | None:
    """The critic of `advantage_estimator=gae` (`trainer.critic`); None otherwise. `optimizer_steps`: the critic's
    optimizer steps in the whole run."""
    trainer = cfg.trainer
    if trainer.algorithm.advantage_estimator != "gae":
        return None
    opt, lora = trainer.critic.optimizer_config, trainer.critic.model.lora
    return ModelSpec(
        path=critic_path, role="critic", lora=dataclasses.asdict(lora) if lora.rank > 0 else None, temperature=1.0,
        gradient_checkpointing=trainer.gradient_checkpointing, **optimizer_fields(opt, optimizer_steps),
        kernels=trainer.kernels, bf16=trainer.bf16,
        flash_attn=trainer.flash_attn, backend_options=STRATEGIES.get(trainer.strategy).backend_options(cfg, "critic"),
        sequence_parallel_size=trainer.critic.sequence_parallel_size)


def setup_worker_groups(cfg, model_path: str, started: StartedWorkers, critic_path: str | None = None,
                        ref_path: str | None = None, training_steps: int = 0) -> None:
    """Every worker builds its models: the policy, the reference and the critic (from `critic_path`, the policy's
    model unless trainer.critic.model.path names one), each on the policy's workers unless it has a group of its
    own. `training_steps`: the run's steps (a learning-rate decay spans their optimizer steps)."""
    backend = STRATEGIES.get(cfg.trainer.strategy).backend
    policy, ref = model_specs(cfg, model_path, ref_path, run_optimizer_steps(cfg, "policy", training_steps))
    critic = critic_spec(cfg, critic_path or model_path, run_optimizer_steps(cfg, "critic", training_steps))
    own_ref, own_critic = started.ref_group, started.critic_group
    started.group.setup(backend, policy, None if own_ref is not None else ref,
                        None if own_critic is not None else critic)
    if own_ref is not None:
        own_ref.setup(backend, None, ref)
    if own_critic is not None:
        own_critic.setup(backend, None, None, critic)


def _options(placed, plan):
    """Ray options of a worker rank: its bundle, and its cores or thread count."""
    if plan.worker_cores:
        return placed  # pinned to the cores the engines leave
    # The launcher's OMP_NUM_THREADS where set, as for its other processes (one thread makes a run reproducible to
    # the bit: BLAS's threads may sum in another order from run to run); else the cores shared out.
    shared_out = max(1, (os.cpu_count() or 1) // plan.training_workers)
    threads = 1 if torch.cuda.is_available() else int(os.environ.get("OMP_NUM_THREADS") or 0) or shared_out
    return lambda rank: {**placed(rank), "runtime_env": {"env_vars": {**ACTOR_ENV, "OMP_NUM_THREADS": str(threads)}}}
