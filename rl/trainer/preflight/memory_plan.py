"""What the memory planner (rl.backends.planner, pure) needs from this machine, and what the launchers and preflight ask
of it: a model's config.json (a local directory, the Hugging Face cache, or the embedded model's, built in code),
the memory of one GPU (`trainer.placement.gpu_memory_gb`, else this machine's first GPU), `trainer.strategy=auto`
for the config loader, and the refusal of a layout predicted not to fit."""

from __future__ import annotations

import json
import os
from typing import Any

from rl.backends.planner import (
    STRATEGY_ORDER,
    Estimate,
    PlanInputs,
    ShapeError,
    configured,
    inputs_from_config,
    plan,
    resolve_tree,
    shape_from_config,
)
from rl.backends.planner.table import breakdown, gib
from rl.backends.planner.terms import GIB
from rl.core.config import config_from_dict
from rl.tasks.jobs import EMBEDDED, EMBEDDED_TEACHER, EMBEDDED_VL

ESCAPE = "trainer.placement.allow_predicted_oom"


def model_config(path: str | None) -> dict[str, Any] | None:
    """The config.json of a model path as a dict: the embedded models' (built in code), a local directory's, or a
    hub name's from the local Hugging Face cache (no download); None when it cannot be had here."""
    if not path:
        return None
    if path == EMBEDDED_VL:
        from rl.tasks.embedded_vl.model import build_tokenizer as vl_tokenizer
        from rl.tasks.embedded_vl.model import tiny_vl_config

        return tiny_vl_config(vl_tokenizer()).to_dict()
    if path in (EMBEDDED, EMBEDDED_TEACHER):
        from rl.tasks.embedded import Recipe, build_tokenizer, tiny_model_config

        return tiny_model_config(build_tokenizer(), Recipe().model_size).to_dict()
    local = os.path.expanduser(path)
    file = os.path.join(local, "config.json")
    if not os.path.isdir(local):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "config.json")
        except Exception:  # a name the hub library refuses is no model we can size
            return None
        file = cached if isinstance(cached, str) else ""
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def device_memory() -> tuple[float | None, str]:
    """(bytes of this machine's first GPU, what it is), or (None, why not)."""
    import torch

    if not torch.cuda.is_available():
        return None, "no GPU here"
    props = torch.cuda.get_device_properties(0)
    return float(props.total_memory), f"GPU 0 of this machine, {props.name}"


def gpu_memory(cfg) -> tuple[float | None, str]:
    """(bytes of one GPU, where the number comes from)."""
    given = cfg.trainer.placement.gpu_memory_gb
    if given is not None:
        return given * GIB, "trainer.placement.gpu_memory_gb"
    return device_memory()


def plan_inputs(cfg, gpu_bytes: float | None = None, on_gpu: bool = True) -> PlanInputs | None:
    """The planner's inputs for `cfg`, or None when the policy's config.json cannot be read here. `gpu_bytes`
    defaults to `gpu_memory(cfg)`; `on_gpu=False` plans CPU worker processes."""
    policy = model_config(cfg.trainer.policy.model.path)
    if policy is None:
        return None
    try:
        shape = shape_from_config(policy, f"{cfg.trainer.policy.model.path}/config.json")
        others = {}
        for role, path in (("ref", cfg.trainer.ref.model.path), ("critic", cfg.trainer.critic.model.path)):
            other = model_config(path) if path else None
            others[role] = shape_from_config(other, f"{path}/config.json") if other else None
    except ShapeError:
        return None
    if gpu_bytes is None and on_gpu:
        gpu_bytes, _ = gpu_memory(cfg)
    return inputs_from_config(cfg, shape, gpu_bytes, others["ref"], others["critic"], on_gpu=on_gpu)


def resolve_auto(tree: dict[str, Any]) -> dict[str, Any]:
    """`load_config(auto=...)`: the keys `trainer.strategy=auto` sets (rl.backends.planner.auto.resolve_tree)."""
    settings, _ = resolve_tree(tree, lambda data: config_from_dict(data, validate=False), plan_inputs)
    return settings


def alternative(cfg, inputs: PlanInputs, current: Estimate) -> Estimate | None:
    """The cheapest layout predicted to fit: of the configured strategy first, then of any."""
    rows = [e for c, e in sorted(plan(cfg, inputs), key=lambda row: not row[0].auto) if e.fits(inputs.gpu_bytes)]
    same = [e for e in rows if e.layout.strategy == current.layout.strategy]
    return (same or rows or [None])[0]


def memory_problems(cfg) -> list[str]:
    """Preflight's check: the configured layout's predicted peak against one GPU, with the numbers and a layout
    that fits (or how to get one), unless trainer.placement.allow_predicted_oom. Nothing is judged when the GPU
    memory or the model's config.json is unknown here, nor a strategy the planner has no memory model of (a
    registered plugin)."""
    if cfg.trainer.placement.allow_predicted_oom or cfg.trainer.strategy not in STRATEGY_ORDER:
        return []
    gpu, source = gpu_memory(cfg)
    inputs = plan_inputs(cfg, gpu) if gpu is not None else None
    if inputs is None:
        return []
    current = configured(cfg, inputs)
    if current.excluded:
        return []  # the config's own checks name what does not divide
    if current.engine_problem:
        key = "kv_cache_memory_bytes" if cfg.generator.kv_cache_memory_bytes is not None else "gpu_memory_utilization"
        return [f"generator.{key}: {current.engine_problem}"]
    return [] if current.fits(gpu) else [_refusal(cfg, inputs, current, gpu, source)]


def host_memory_problems(cfg, root: str = "/") -> list[str]:
    """Preflight's check on a machine without GPUs, where every training worker is a process of this host: the
    planner's peak per worker (planned for CPU processes: fp32 unless trainer.bf16) times the workers, against the
    memory this host has available (its cgroup's limit where lower), unless trainer.placement.allow_predicted_oom.
    `root`: where /proc and /sys are (a test's copy). A strategy the planner has no memory model of is not judged."""
    if cfg.trainer.placement.allow_predicted_oom or cfg.trainer.strategy not in STRATEGY_ORDER:
        return []
    inputs = plan_inputs(cfg, None, on_gpu=False)
    if inputs is None:
        return []
    current = configured(cfg, inputs)
    if current.excluded or current.engine_problem:
        return []  # the config's own checks, and the engine's memory check, name those
    need = current.peak * inputs.world
    available, where = host_available(root)
    if need <= available:
        return []
    return [f"trainer.strategy: {current.label} on this machine's CPUs is predicted to need {gib(current.peak)} GiB "
            f"per worker at its peak ({current.phase}; {breakdown(current)}), {gib(need)} GiB for its "
            f"{inputs.world} worker{'s' if inputs.world > 1 else ''}, more than the {gib(available)} GiB available "
            f"({where}); train a smaller model, LoRA adapters (trainer.policy.model.lora.rank), fewer workers "
            "(trainer.placement.policy_num_gpus_per_node), run on GPUs, or set "
            f"{ESCAPE}=true to run anyway"]


def host_available(root: str = "/") -> tuple[float, str]:
    """(bytes this host can still give, where the figure comes from): MemAvailable, or the cgroup's limit less
    its usage where that is lower (cgroup v2, then v1)."""
    available, where = None, "MemAvailable of /proc/meminfo"
    with open(os.path.join(root, "proc/meminfo"), encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available = float(line.split()[1]) * 1024
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            with open(os.path.join(root, "sys/fs/cgroup", limit_file)) as f:
                limit = f.read().strip()
            with open(os.path.join(root, "sys/fs/cgroup", usage_file)) as f:
                usage = float(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit != "max" and float(limit) < 2**60 and float(limit) - usage < (available or float("inf")):
            available, where = float(limit) - usage, f"the cgroup's {limit_file} less its usage"
        break
    return (available if available is not None else float("inf")), where


def _refusal(cfg, inputs: PlanInputs, current: Estimate, gpu: float, source: str) -> str:
    head = (f"trainer.strategy: {current.label} as configured is predicted to need {gib(current.peak)} GiB "
            f"per GPU at its peak ({current.phase}; {breakdown(current)}), more than the {gib(gpu)} GiB of one GPU "
            f"({source}) on {inputs.world} GPU{'s' if inputs.world > 1 else ''}")
    fix = alternative(cfg, inputs, current)
    if fix is not None:
        hint = f"a layout predicted to fit ({gib(fix.peak)} GiB): {' '.join(fix.layout.overrides())}"
    else:
        rows = [e for _, e in plan(cfg, inputs) if not e.excluded]
        smallest = min(rows, key=lambda e: e.peak) if rows else None
        least = f" (the smallest, {smallest.label}, needs {gib(smallest.peak)} GiB)" if smallest else ""
        hint = (f"no layout is predicted to fit{least}: add GPUs (trainer.placement.policy_num_gpus_per_node, "
                "policy_num_nodes), train LoRA adapters (trainer.policy.model.lora.rank) or shorten micro-batches "
                "(trainer.max_tokens_per_micro_batch)")
    return f"{head}; {hint}; or set {ESCAPE}=true to run anyway (bazel run //rl/launch:plan prints every layout)"
