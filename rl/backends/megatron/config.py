"""Strategy `megatron` as the config layer sees it: the `trainer.policy.megatron_config` block, its layout rules,
its model-parallel size (TP x PP ranks share one data shard) and the NeMo RL `policy.megatron_cfg.*` keys.

Sizes: TP x PP ranks share one copy of the dense weights, so the dense data-parallel size is world / (TP * PP).
Experts are split over EP ranks with expert tensor parallelism ETP = TP, so the expert data-parallel size is
world / (TP * EP * PP). Both must be whole numbers (megatron-core's rule).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rl.core.config.checks_values import at_least, check_rules, one_of, optional
from rl.core.config.errors import Problems
from rl.core.config.parallel import policy_world_size
from rl.core.config.strategies import StrategyConfig, local_model_config

BLOCK = "trainer.policy.megatron_config"
RECOMPUTE_GRANULARITIES = ("full", "selective")
_WORLD = "trainer.placement.policy_num_nodes * trainer.placement.policy_num_gpus_per_node"


@dataclass(kw_only=True)
class MegatronConfig:
    """Knobs of the `megatron` strategy (megatron-core parallelism).

    Rule checked at load time, with world = policy_num_nodes * policy_num_gpus_per_node:
    world % (TP * PP) == 0, dense data-parallel size = world / (TP * PP); with EP > 1 also
    world % (TP * EP * PP) == 0, expert data-parallel size = world / (ETP * EP * PP) with the expert
    tensor-parallel size ETP = TP (megatron-core's default, which the backend uses). Checked when the model is
    built: TP divides the attention and key/value heads, PP the layers, EP the experts.
    The ranks of one TP x PP group form one data-parallel shard: the driver sends them the same micro-batches, and
    megatron's schedule runs all micro-batches of a mini-batch (1F1B across the stages with PP > 1).
    """

    tensor_model_parallel_size: int = 1
    """Tensor-parallel size (TP): each layer's weights are split over this many ranks."""

    pipeline_model_parallel_size: int = 1
    """Pipeline-parallel size (PP): the layers are split into this many stages."""

    virtual_pipeline_model_parallel_size: int | None = None
    """Interleaved pipeline schedule (VP): each pipeline rank holds this many model chunks, chunk k of rank r the
    layer block k * PP + r, which shrinks the pipeline bubble by about this factor for more point-to-point
    traffic. `null` or 1: the plain 1F1B schedule. Needs PP > 1, and PP * VP must divide the layers. The
    interleaved schedule runs a multiple of PP micro-batches, so a mini-batch's micro-batches are padded with
    empty ones to the next multiple. Checkpoints are stored as PP * VP pipeline stages (`rl.launch.convert` reads
    them as such)."""

    expert_model_parallel_size: int = 1
    """Expert-parallel size (EP) for mixture-of-experts layers; 1 for dense models."""

    sequence_parallel: bool = False
    """Megatron sequence parallelism: shard layer-norm and dropout activations over the TP group. Needs TP > 1."""

    context_parallel_size: int = 1
    """Context parallelism (CP): each packed micro-batch split over this many ranks of the data-parallel group, a
    contiguous slice each, keys and values all-gathered for attention (context_parallel.py); the data-parallel
    size becomes world / (TP * PP * CP). Not with trainer.policy.use_fused_kernels."""

    recompute_granularity: str | None = None
    """Activation recomputation: `null` (none, or `full` when trainer.gradient_checkpointing is true), `full`
    (whole layers) or `selective` (attention core only)."""

    transformer_config_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed as they are to megatron-core's `TransformerConfig`."""

    optimizer_cpu_offload: bool = False
    """Keep fp32 master weights and the AdamW moments in host memory and run the update on the CPU; the device
    holds only weights and gradients (a host round trip per optimizer step). Same numbers as without it."""

    def virtual_pipeline_size(self) -> int:
        return self.virtual_pipeline_model_parallel_size or 1

    @classmethod
    def from_options(cls, options: dict | None) -> MegatronConfig:
        """The block as the backend receives it (`ModelSpec.backend_options`); absent keys take their defaults."""
        unknown = sorted(set(options or {}) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{BLOCK}: unknown keys {unknown}")
        return cls(**(options or {}))


def layout_problems(world: int, tp: int, pp: int, ep: int, sequence_parallel: bool, vp: int = 1, cp: int = 1
                    ) -> list[tuple[str, str]]:
    """(key, problem) for each of megatron-core's layout rules the sizes break."""
    found = []
    if cp > 1 and world % (tp * pp) == 0 and (world // (tp * pp)) % cp:
        found.append((f"{BLOCK}.context_parallel_size",
                      f"{cp} must divide the data-parallel size {world // (tp * pp)} (world {world} / (TP {tp} * PP "
                      f"{pp})): CP splits a data-parallel shard's micro-batches. Change CP or the placement"))
    if vp > 1 and pp == 1:
        found.append((f"{BLOCK}.virtual_pipeline_model_parallel_size",
                      f"is {vp}, but the interleaved schedule needs pipeline_model_parallel_size > 1; set it to "
                      "null or raise PP"))
    if world % (tp * pp):
        found.append((f"{BLOCK}.tensor_model_parallel_size",
                      f"TP {tp} * PP {pp} = {tp * pp} must divide the world size {world} ({_WORLD}); the dense "
                      "data-parallel size is world / (TP * PP). Change TP, PP or the placement"))
    elif ep > 1 and world % (tp * ep * pp):
        found.append((f"{BLOCK}.expert_model_parallel_size",
                      f"with expert parallelism, TP {tp} * EP {ep} * PP {pp} = {tp * ep * pp} must divide the world "
                      f"size {world} ({_WORLD}): the expert data-parallel size is world / (ETP * EP * PP), where "
                      "the expert tensor-parallel size ETP equals TP. Change EP, TP, PP or the placement"))
    if sequence_parallel and tp == 1:
        found.append((f"{BLOCK}.sequence_parallel",
                      "needs tensor_model_parallel_size > 1 (it shards activations over the TP group); set it to "
                      "false or raise TP"))
    return found


def model_problems(model, tp: int, pp: int, ep: int, vp: int = 1) -> list[tuple[str, str]]:
    """(key, problem) for each size of the model (a Hugging Face config: attribute access) the layout does not
    divide; megatron-core itself only asserts."""
    found = []
    heads = model.num_attention_heads
    kv_heads = getattr(model, "num_key_value_heads", None) or heads
    for what, count in (("attention heads", heads), ("key/value heads", kv_heads)):
        if count % tp:
            found.append((f"{BLOCK}.tensor_model_parallel_size", f"{tp} must divide the model's {count} {what}"))
    if model.num_hidden_layers % pp:
        found.append((f"{BLOCK}.pipeline_model_parallel_size",
                      f"{pp} must divide the model's {model.num_hidden_layers} layers"))
    elif model.num_hidden_layers % (pp * vp):
        found.append((f"{BLOCK}.virtual_pipeline_model_parallel_size",
                      f"PP {pp} * VP {vp} = {pp * vp} must divide the model's {model.num_hidden_layers} layers"))
    experts = getattr(model, "num_local_experts", None)
    if ep > 1 and (experts is None or experts % ep):
        found.append((f"{BLOCK}.expert_model_parallel_size", f"{ep} must divide the model's experts ({experts})"))
    return found


def kwargs_problems(kwargs: dict[str, Any], own_keys: set[str] = frozenset()) -> list[tuple[str, str]]:
    """`transformer_config_kwargs` checked against megatron-core's own TransformerConfig: every key must be one of
    its fields and not one the block sets itself (`own_keys`), and `recompute_modules` must be values its
    validation accepts."""
    if not kwargs:
        return []
    import difflib

    from megatron.core.transformer.transformer_config import TransformerConfig

    key = f"{BLOCK}.transformer_config_kwargs"
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    found = [(f"{key}.{name}", f"is a key of {BLOCK} itself; set {BLOCK}.{name} instead")
             for name in sorted(set(kwargs) & set(own_keys))]
    for name in sorted(set(kwargs) - fields):
        close = difflib.get_close_matches(name, fields, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        found.append((f"{key}.{name}", f"is not a field of megatron-core's TransformerConfig{hint}; remove it"))
    if "recompute_modules" in kwargs:
        try:
            TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=1, recompute_granularity="selective",
                              recompute_modules=kwargs["recompute_modules"])
        except (AssertionError, ValueError, TypeError) as error:
            found.append((f"{key}.recompute_modules", f"megatron-core refuses it: {error}"))
    return found


class MegatronStrategy(StrategyConfig):
    name = "megatron"
    backend = "rl.backends.megatron.backend:MegatronBackend"
    blocks: ClassVar[dict[str, type]] = {BLOCK: MegatronConfig}
    nemo_flags = ("policy.megatron_cfg.enabled",)
    nemo_priority = 2
    nemo_keys: ClassVar[dict[str, str]] = {
        **{f"policy.megatron_cfg.{name}": f"{BLOCK}.{name}" for name in (
            "tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
            "sequence_parallel")},
        "policy.megatron_cfg.virtual_pipeline_model_parallel_size": f"{BLOCK}.virtual_pipeline_model_parallel_size",
        "policy.megatron_cfg.context_parallel_size": f"{BLOCK}.context_parallel_size",
        "policy.megatron_cfg.optimizer.optimizer_cpu_offload": f"{BLOCK}.optimizer_cpu_offload",
    }
    ulysses_hint = (f", and use {BLOCK}.context_parallel_size to split long sequences (or {BLOCK}.sequence_parallel"
                    "=true with TP > 1 to shard activations)")
    lora = True
    own_attention = "its own PyTorch SDPA over packed sequences (rl/backends/megatron/attention.py)"

    def check(self, cfg, problems: Problems) -> None:
        before = len(problems.lines)
        check_rules(cfg, problems, [
            *(at_least(f"{BLOCK}.{name}_model_parallel_size", 1) for name in ("tensor", "pipeline", "expert")),
            at_least(f"{BLOCK}.context_parallel_size", 1),
            optional(at_least(f"{BLOCK}.virtual_pipeline_model_parallel_size", 1)),
            optional(one_of(f"{BLOCK}.recompute_granularity", RECOMPUTE_GRANULARITIES)),
        ])
        block, world = cfg.blocks[BLOCK], policy_world_size(cfg)
        sizes = (block.tensor_model_parallel_size, block.pipeline_model_parallel_size, block.expert_model_parallel_size)
        vp = block.virtual_pipeline_size()
        if len(problems.lines) == before and world >= 1:
            for key, problem in layout_problems(world, *sizes, block.sequence_parallel, vp,
                                                block.context_parallel_size):
                problems.add(key, problem)
            model = local_model_config(cfg.trainer.policy.model.path)
            if getattr(model, "vision_config", None) is not None:
                model = None  # a vision-language model: refused for megatron by preflight (vision_preflight)
            for key, problem in model_problems(model, *sizes, vp) if model is not None else ():
                problems.add(key, f"{problem} ({cfg.trainer.policy.model.path}/config.json); pick a divisor")
        for key, problem in kwargs_problems(block.transformer_config_kwargs, set(dataclasses.asdict(block))):
            problems.add(key, problem)
        if block.context_parallel_size > 1 and cfg.trainer.policy.use_fused_kernels:
            problems.add("trainer.policy.use_fused_kernels",
                         f"is true, but the fused loss does not run with context parallelism yet "
                         f"({BLOCK}.context_parallel_size={block.context_parallel_size}); set it to false")
        for model in ("policy", "critic"):
            lora = getattr(cfg.trainer, model).model.lora
            if lora.rank > 0 and lora.dropout > 0:
                problems.add(f"trainer.{model}.model.lora.dropout",
                             f"is {lora.dropout}, but megatron's adapters take no dropout (the TP ranks of an adapter "
                             "would need one mask); set it to 0 or use trainer.strategy=fsdp2")
        if cfg.trainer.kernels != "auto":
            problems.add("trainer.kernels",
                         f"is {cfg.trainer.kernels}, but trainer.strategy=megatron computes its vocab-parallel "
                         "logprobs in torch and uses no rl.kernels implementation; set it to auto")

    def model_parallel_size(self, cfg, role: str = "policy") -> tuple[int, str]:  # every model's layout
        block = cfg.blocks[BLOCK]
        tp, pp, cp = block.tensor_model_parallel_size, block.pipeline_model_parallel_size, block.context_parallel_size
        return tp * pp * cp, f"TP {tp} * PP {pp}" + (f" * CP {cp}" if cp > 1 else "")

    def backend_options(self, cfg, role: str) -> dict:
        return dataclasses.asdict(cfg.blocks[BLOCK])  # policy and reference share the layout
