"""Backend-specific config blocks: each training backend keeps its knobs in a block of its own.

The dataclasses carry types and documentation; every value, defaults included, comes from `defaults.yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(kw_only=True)
class FSDPConfig:
    """Knobs of the `fsdp` and `fsdp2` strategies, for one model (policy or reference)."""

    cpu_offload: bool
    """Keep parameters (and, for the policy, gradients and optimizer state) in host memory between uses.
    The policy cannot use it with strategy `fsdp`: FSDP1 cannot accumulate gradients outside `no_sync` with CPU
    offload. Use `fsdp2`, or offload only the reference model (`trainer.ref.fsdp_config.cpu_offload`)."""

    reshard_after_forward: bool
    """Free the gathered parameters after each forward (ZeRO-3 style). `false` keeps them until after backward
    (ZeRO-2 style): faster, more memory."""

    fsdp_size: int
    """Number of ranks one parameter shard group spans; `-1` shards over the whole world. Any other value must divide
    the world size; the groups are then replicated (HSDP)."""


@dataclass(kw_only=True)
class MegatronConfig:
    """Knobs of the `megatron` strategy (megatron-core parallelism).

    Rule checked at load time, with world = policy_num_nodes * policy_num_gpus_per_node:
    world % (TP * PP) == 0, dense data-parallel size = world / (TP * PP); with EP > 1 also
    world % (TP * EP * PP) == 0, expert data-parallel size = world / (ETP * EP * PP) with the expert
    tensor-parallel size ETP = TP (megatron-core's default, which the backend uses). Checked when the model is
    built: TP divides the attention and key/value heads, PP the layers, EP the experts.
    The trainer gives every worker its own micro-batches; the ranks of one TP x PP group run theirs together as
    one packed batch, so each of the world / (TP * PP) groups is one data-parallel replica.
    """

    tensor_model_parallel_size: int
    """Tensor-parallel size (TP): each layer's weights are split over this many ranks."""

    pipeline_model_parallel_size: int
    """Pipeline-parallel size (PP): the layers are split into this many stages."""

    expert_model_parallel_size: int
    """Expert-parallel size (EP) for mixture-of-experts layers; 1 for dense models."""

    sequence_parallel: bool
    """Megatron sequence parallelism: shard layer-norm and dropout activations over the TP group. Needs TP > 1."""

    recompute_granularity: str | None
    """Activation recomputation: `null` (none), `full` (whole layers) or `selective` (attention core only)."""

    transformer_config_kwargs: dict[str, Any]
    """Extra keyword arguments passed as they are to megatron-core's `TransformerConfig`."""

    optimizer_cpu_offload: bool
    """Keep fp32 master weights and the AdamW moments in host memory and run the update on the CPU; the device
    holds only weights and gradients (a host round trip per optimizer step). Same numbers as without it."""


@dataclass(kw_only=True)
class DeepSpeedConfig:
    """DeepSpeed configuration dictionaries, passed through to DeepSpeed (strategy `deepspeed` only).

    Empty here; the deepspeed backend fills what is not given from its own defaults.
    """

    train: dict[str, Any]
    """DeepSpeed config of the trained policy (ZeRO stage, offload, ...); merged over the backend's defaults."""

    eval: dict[str, Any]
    """DeepSpeed config of models used only for inference (the reference model)."""
