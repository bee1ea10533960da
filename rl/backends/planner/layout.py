"""A candidate layout: a strategy and the config keys it sets, and the knobs the estimate reads from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FSDP_BLOCK = "trainer.policy.fsdp_config"
REF_FSDP_BLOCK = "trainer.ref.fsdp_config"
CRITIC_FSDP_BLOCK = "trainer.critic.fsdp_config"
DS_TRAIN = "deepspeed_config.train.zero_optimization"
DS_EVAL = "deepspeed_config.eval.zero_optimization"
MEGATRON_BLOCK = "trainer.policy.megatron_config"
CHECKPOINTING = "trainer.gradient_checkpointing"
DEEPSPEED_DEFAULTS = {"stage": 2, "reduce_bucket_size": 500_000_000, "eval_stage": 0}
"""What rl/backends/deepspeed_defaults.yaml gives a key `deepspeed_config` leaves unset (read here by value: the
config layer does not import the backends)."""


@dataclass(frozen=True)
class Knobs:
    """The settings of a layout that change its memory, whatever strategy block they come from."""

    strategy: str
    checkpointing: bool = False
    offload: bool = False
    """fsdp/fsdp2: the policy's `cpu_offload`; deepspeed: `offload_optimizer`; megatron: `optimizer_cpu_offload`."""
    reshard: bool = True
    shard_size: int = -1
    ref_offload: bool = False
    critic_offload: bool = False
    zero_stage: int = 2
    offload_param: bool = False
    ref_zero_stage: int = 0
    reduce_bucket: int = 500_000_000
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    vp: int = 1
    sequence_parallel: bool = False
    recompute: str | None = None
    """megatron's effective recompute: None, `full` or `selective` (gradient_checkpointing means `full`)."""

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp if self.strategy == "megatron" else 1

    def label(self) -> str:
        """The layout in a few words: the strategy and what differs from its defaults."""
        if self.strategy in ("fsdp", "fsdp2"):
            parts = [("ckpt", self.checkpointing), ("offload", self.offload), ("ref_offload", self.ref_offload),
                     ("critic_offload", self.critic_offload), ("reshard=false", not self.reshard),
                     (f"fsdp_size={self.shard_size}", self.shard_size > 0)]
        elif self.strategy == "deepspeed":
            parts = [(f"zero={self.zero_stage}", True), ("ckpt", self.checkpointing), ("offload_opt", self.offload),
                     ("offload_param", self.offload_param), (f"ref_zero={self.ref_zero_stage}", self.ref_zero_stage)]
        elif self.strategy == "megatron":
            parts = [(f"tp={self.tp}", True), (f"pp={self.pp}", True), (f"ep={self.ep}", self.ep > 1),
                     (f"cp={self.cp}", self.cp > 1), (f"vp={self.vp}", self.vp > 1), ("sp", self.sequence_parallel),
                     (f"recompute={self.recompute}", self.recompute), ("offload_opt", self.offload)]
        else:
            parts = [("ckpt", self.checkpointing)]
        return " ".join([self.strategy, *(name for name, used in parts if used)])


@dataclass(frozen=True)
class Layout:
    """A strategy and the keys that set its layout (over the user's config)."""

    strategy: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    def overrides(self) -> list[str]:
        """The layout as `key=value` arguments (trainer.strategy first)."""
        def text(value: Any) -> str:
            return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)

        return [f"trainer.strategy={self.strategy}", *(f"{key}={text(value)}" for key, value in self.settings.items())]


def read_key(cfg, key: str, default: Any = None) -> Any:
    """The value at dotted `key` of a Config: a strategy's block (`cfg.blocks`) or the schema's tree; inside a
    free-form dict (deepspeed_config.train...) a missing key gives `default`."""
    for block_key, block in cfg.blocks.items():
        if key == block_key or key.startswith(block_key + "."):
            node: Any = block
            rest = key[len(block_key) + 1:].split(".") if key != block_key else []
            break
    else:
        node, rest = cfg, key.split(".")
    for part in rest:
        if isinstance(node, Mapping):
            if part not in node:
                return default
            node = node[part]
        elif hasattr(node, part):
            node = getattr(node, part)
        else:
            return default
    return node


def knobs_for(cfg, layout: Layout) -> Knobs:
    """What `layout` runs with: its settings over the user's config."""
    def get(key: str, default: Any = None) -> Any:
        return layout.settings[key] if key in layout.settings else read_key(cfg, key, default)

    strategy = layout.strategy
    checkpointing = bool(get(CHECKPOINTING, False))
    if strategy in ("fsdp", "fsdp2"):
        return Knobs(strategy, checkpointing, offload=bool(get(f"{FSDP_BLOCK}.cpu_offload", False)),
                     reshard=bool(get(f"{FSDP_BLOCK}.reshard_after_forward", True)),
                     shard_size=int(get(f"{FSDP_BLOCK}.fsdp_size", -1)),
                     ref_offload=bool(get(f"{REF_FSDP_BLOCK}.cpu_offload", False)),
                     critic_offload=bool(get(f"{CRITIC_FSDP_BLOCK}.cpu_offload", False)))
    if strategy == "deepspeed":
        return Knobs(strategy, checkpointing,
                     zero_stage=int(get(f"{DS_TRAIN}.stage", DEEPSPEED_DEFAULTS["stage"])),
                     offload=get(f"{DS_TRAIN}.offload_optimizer.device", "none") not in (None, "none"),
                     offload_param=get(f"{DS_TRAIN}.offload_param.device", "none") not in (None, "none"),
                     ref_zero_stage=int(get(f"{DS_EVAL}.stage", DEEPSPEED_DEFAULTS["eval_stage"])),
                     reduce_bucket=int(get(f"{DS_TRAIN}.reduce_bucket_size",
                                           DEEPSPEED_DEFAULTS["reduce_bucket_size"])))
    if strategy == "megatron":
        granularity = get(f"{MEGATRON_BLOCK}.recompute_granularity")
        return Knobs(strategy, checkpointing,
                     offload=bool(get(f"{MEGATRON_BLOCK}.optimizer_cpu_offload", False)),
                     tp=int(get(f"{MEGATRON_BLOCK}.tensor_model_parallel_size", 1)),
                     pp=int(get(f"{MEGATRON_BLOCK}.pipeline_model_parallel_size", 1)),
                     ep=int(get(f"{MEGATRON_BLOCK}.expert_model_parallel_size", 1)),
                     cp=int(get(f"{MEGATRON_BLOCK}.context_parallel_size", 1)),
                     vp=int(get(f"{MEGATRON_BLOCK}.virtual_pipeline_model_parallel_size") or 1),
                     sequence_parallel=bool(get(f"{MEGATRON_BLOCK}.sequence_parallel", False)),
                     recompute=granularity or ("full" if checkpointing else None))
    return Knobs(strategy, checkpointing)
