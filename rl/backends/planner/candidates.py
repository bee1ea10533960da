"""The candidate layouts of each strategy, cheapest first, and why a layout cannot run at all.

"Cheapest" is a ranking of step time, not a measurement: a layout that recomputes activations or moves state to
the host is slower than one that does not, and model parallelism (megatron's TP x PP x CP) costs communication and
shrinks the data-parallel size. `LayoutCost` writes that order down.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl.backends.planner.estimate import Estimate, estimate
from rl.backends.planner.inputs import PlanInputs
from rl.backends.planner.layout import (
    CHECKPOINTING,
    CRITIC_FSDP_BLOCK,
    DS_TRAIN,
    FSDP_BLOCK,
    MEGATRON_BLOCK,
    REF_FSDP_BLOCK,
    Knobs,
    Layout,
    knobs_for,
)

STRATEGY_ORDER = ("fsdp2", "fsdp", "deepspeed", "megatron")
POWERS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    auto: bool = True
    """Whether `trainer.strategy=auto` may pick it (false for rows that trade memory for speed, shown only)."""


def _fsdp(inputs: PlanInputs, strategy: str) -> list[Candidate]:
    """Checkpointing, then CPU offload (the reference's and the critic's too when they share the GPUs; FSDP1
    offloads only the reference), then both; shown only: no resharding after forward, and HSDP within a node."""
    ckpt = {CHECKPOINTING: True}
    offload = {f"{REF_FSDP_BLOCK}.cpu_offload": True} if inputs.ref_shape is not None else {}
    if strategy == "fsdp2":
        offload = {f"{FSDP_BLOCK}.cpu_offload": True, **offload}
        if inputs.critic_shape is not None:
            offload[f"{CRITIC_FSDP_BLOCK}.cpu_offload"] = True
    rows = [Candidate(Layout(strategy)), Candidate(Layout(strategy, ckpt))]
    if offload:
        rows += [Candidate(Layout(strategy, offload)), Candidate(Layout(strategy, {**ckpt, **offload}))]
    rows.append(Candidate(Layout(strategy, {f"{FSDP_BLOCK}.reshard_after_forward": False}), auto=False))
    if inputs.world > inputs.gpus_per_node:
        rows.append(Candidate(Layout(strategy, {f"{FSDP_BLOCK}.fsdp_size": inputs.gpus_per_node}), auto=False))
    return rows


def _deepspeed(inputs: PlanInputs) -> list[Candidate]:
    stage, ckpt = f"{DS_TRAIN}.stage", {CHECKPOINTING: True}
    opt, param = f"{DS_TRAIN}.offload_optimizer.device", f"{DS_TRAIN}.offload_param.device"
    return [Candidate(Layout("deepspeed", {stage: s, **extra}))
            for s, extra in ((1, {}), (2, {}), (2, ckpt), (3, {}), (3, ckpt), (2, {**ckpt, opt: "cpu"}),
                             (3, {**ckpt, opt: "cpu", param: "cpu"}))]


def _megatron(inputs: PlanInputs) -> list[Candidate]:
    shape, world = inputs.shape, inputs.world
    tps = [t for t in POWERS if t <= max(inputs.gpus_per_node, 1) and t <= world]
    eps = [1]
    if shape.is_moe:
        eps += [max(e for e in POWERS if shape.experts % e == 0 and e <= world)]
    cps = [1, 2] if inputs.train_tokens >= 16384 and not inputs.fused else [1]
    rows = []
    for tp in tps:
        for pp in (p for p in POWERS if tp * p <= world):
            for ep in sorted(set(eps)):
                for cp in cps:
                    for recompute in (None, "full"):
                        settings = {f"{MEGATRON_BLOCK}.tensor_model_parallel_size": tp,
                                    f"{MEGATRON_BLOCK}.pipeline_model_parallel_size": pp}
                        optional = (("expert_model_parallel_size", ep, ep > 1), ("context_parallel_size", cp, cp > 1),
                                    ("sequence_parallel", True, tp > 1),
                                    ("recompute_granularity", recompute, recompute is not None))
                        settings.update({f"{MEGATRON_BLOCK}.{key}": value for key, value, used in optional if used})
                        rows.append(((tp * pp * cp, recompute is not None, -ep, pp), Layout("megatron", settings)))
    rows.sort(key=lambda row: row[0])
    out = [Candidate(layout) for _, layout in rows]
    splittable = [layout for _, layout in rows if _splits(inputs, layout)]
    if splittable:  # the last resort: the most split layout, recomputing, with the optimizer in host memory
        out.append(Candidate(Layout("megatron", {**splittable[-1].settings,
                                                 f"{MEGATRON_BLOCK}.optimizer_cpu_offload": True})))
    return out


def _splits(inputs: PlanInputs, layout: Layout) -> bool:
    """Whether a megatron layout's TP divides the heads and its PP the layers."""
    shape, settings = inputs.shape, layout.settings
    tp = settings.get(f"{MEGATRON_BLOCK}.tensor_model_parallel_size", 1)
    pp = settings.get(f"{MEGATRON_BLOCK}.pipeline_model_parallel_size", 1)
    return shape.heads % tp == 0 and shape.kv_heads % tp == 0 and shape.layers % pp == 0


def candidates(inputs: PlanInputs, strategy: str) -> list[Candidate]:
    """The layouts the planner considers for `strategy`, cheapest first."""
    if strategy in ("fsdp", "fsdp2"):
        return _fsdp(inputs, strategy)
    if strategy == "deepspeed":
        return _deepspeed(inputs)
    if strategy == "megatron":
        return _megatron(inputs)
    return [Candidate(Layout(strategy))]


def _megatron_problem(inputs: PlanInputs, k: Knobs) -> str | None:
    shape, world = inputs.shape, inputs.world
    checks = (
        (world % (k.tp * k.pp * k.cp) != 0, f"TP {k.tp} x PP {k.pp} x CP {k.cp} does not divide the {world} GPUs"),
        (k.ep > 1 and world % (k.tp * k.ep * k.pp) != 0, f"TP x EP x PP = {k.tp * k.ep * k.pp} does not divide "
                                                         f"the {world} GPUs"),
        (shape.heads % k.tp != 0 or shape.kv_heads % k.tp != 0,
         f"TP {k.tp} does not divide the {shape.heads} attention / {shape.kv_heads} key-value heads"),
        (shape.layers % (k.pp * k.vp) != 0, f"PP {k.pp} x VP {k.vp} does not divide the {shape.layers} layers"),
        (k.ep > 1 and (not shape.is_moe or shape.experts % k.ep != 0),
         f"EP {k.ep} does not divide the model's {shape.experts} experts"),
        (k.sequence_parallel and k.tp == 1, "sequence parallelism needs TP > 1"),
        (k.cp > 1 and inputs.fused, "the fused loss does not run with context parallelism"),
    )
    return next((why for bad, why in checks if bad), None)


def exclusion(inputs: PlanInputs, k: Knobs) -> str | None:
    """Why a layout cannot run (None: it can): a size that does not divide, an option the strategy lacks, or
    micro-batches that do not split over its data-parallel size."""
    if inputs.ulysses > 1 and k.strategy not in ("fsdp", "fsdp2"):
        return "Ulysses (trainer.policy.sequence_parallel_size) runs under fsdp and fsdp2 only"
    if k.strategy == "fsdp" and k.offload:
        return "FSDP1 cannot accumulate gradients with the policy's CPU offload (use fsdp2)"
    if k.strategy in ("fsdp", "fsdp2") and k.shard_size > 0 and inputs.world % k.shard_size:
        return f"fsdp_size {k.shard_size} does not divide the {inputs.world} GPUs"
    if k.strategy == "deepspeed" and k.offload_param and k.zero_stage < 3:
        return "offload_param needs ZeRO stage 3"
    if k.strategy == "megatron" and inputs.shape.vision:
        return "megatron takes no vision-language model (its conversion has no vision tower)"
    if k.strategy == "megatron":
        problem = _megatron_problem(inputs, k)
        if problem:
            return problem
    group = k.model_parallel if k.strategy == "megatron" else max(inputs.ulysses, 1)
    dp = inputs.world // group if group and inputs.world % group == 0 else 0
    per_step = inputs.micro_batch_sequences * dp
    if inputs.mini_batch_sequences and per_step and inputs.mini_batch_sequences % per_step:
        return (f"policy_mini_batch_size x n_samples_per_prompt = {inputs.mini_batch_sequences} sequences do not "
                f"split into micro-batches of {inputs.micro_batch_sequences} over DP {dp}")
    return None


def plan(cfg, inputs: PlanInputs, strategies: tuple[str, ...] = STRATEGY_ORDER) -> list[tuple[Candidate, Estimate]]:
    """Every candidate of `strategies` with its estimate, in each strategy's cost order; layouts that come out
    the same as an earlier one (the user's config already sets what a candidate adds) are left out."""
    rows, seen = [], set()
    for strategy in strategies:
        for candidate in candidates(inputs, strategy):
            knobs = knobs_for(cfg, candidate.layout)
            if knobs in seen:
                continue
            seen.add(knobs)
            rows.append((candidate, estimate(inputs, candidate.layout, knobs, exclusion(inputs, knobs))))
    return rows


def configured(cfg, inputs: PlanInputs) -> Estimate:
    """The estimate of the config as it is."""
    layout = Layout(cfg.trainer.strategy)
    knobs = knobs_for(cfg, layout)
    return estimate(inputs, layout, knobs, exclusion(inputs, knobs))
