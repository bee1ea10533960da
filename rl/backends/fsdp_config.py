"""Strategies `fsdp` and `fsdp2` as the config layer sees them: each model's `fsdp_config` block, its checks, and
the NeMo RL DTensor keys (`policy.dtensor_cfg.*`) that select and configure `fsdp2`."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import ClassVar

from rl.core.config.checks_values import check_rules, special_or_at_least_one
from rl.core.config.errors import Problems
from rl.core.config.parallel import policy_world_size, ref_world_size
from rl.core.config.strategies import StrategyConfig, local_model_config

POLICY_BLOCK = "trainer.policy.fsdp_config"
REF_BLOCK = "trainer.ref.fsdp_config"
CRITIC_BLOCK = "trainer.critic.fsdp_config"
BLOCK_OF_ROLE = {"policy": POLICY_BLOCK, "ref": REF_BLOCK, "critic": CRITIC_BLOCK}


@dataclass(kw_only=True)
class FSDPConfig:
    """Knobs of the `fsdp` and `fsdp2` strategies, for one model (policy, reference or critic)."""

    cpu_offload: bool = False
    """Keep parameters (and, for the policy, gradients and optimizer state) in host memory between uses.
    The policy cannot use it with strategy `fsdp`: FSDP1 cannot accumulate gradients outside `no_sync` with CPU
    offload. Use `fsdp2`, or offload only the reference model (`trainer.ref.fsdp_config.cpu_offload`)."""

    reshard_after_forward: bool = True
    """Free the gathered parameters after each forward (ZeRO-3 style). `false` keeps them until after backward
    (ZeRO-2 style): faster, more memory."""

    fsdp_size: int = -1
    """Number of ranks one parameter shard group spans; `-1` shards over the whole world. Any other value must divide
    the world size; the groups are then replicated (HSDP)."""

    @classmethod
    def from_options(cls, options: dict | None) -> FSDPConfig:
        """The block as the backend receives it (`ModelSpec.backend_options`); absent keys take their defaults."""
        return cls(**(options or {}))


def offloads(options: FSDPConfig, device_type: str, is_main: bool) -> bool:
    """Whether the model's parameters go to host memory: `cpu_offload` on an accelerator. On a CPU machine they are
    there already; rank 0 says so once."""
    if options.cpu_offload and device_type == "cpu":
        if is_main:
            _say_once("fsdp_config.cpu_offload: on this CPU machine the model already lives in host memory; there is "
                      "nothing to offload")
        return False
    return options.cpu_offload


@functools.cache
def _say_once(message: str) -> None:
    print(message, flush=True)


def _dtensor_keys() -> dict[str, str]:
    return {f"policy.{section}.{name}": target for section in ("dtensor_cfg", "dtensor_config")
            for name, target in (("cpu_offload", POLICY_BLOCK + ".cpu_offload"),
                                 ("activation_checkpointing", "trainer.gradient_checkpointing"))}


class FSDP2Strategy(StrategyConfig):
    name = "fsdp2"
    backend = "rl.backends.fsdp2:FSDP2Backend"
    blocks: ClassVar[dict[str, type]] = {POLICY_BLOCK: FSDPConfig, REF_BLOCK: FSDPConfig, CRITIC_BLOCK: FSDPConfig}
    nemo_flags = ("policy.dtensor_cfg.enabled", "policy.dtensor_config.enabled")
    nemo_priority = 1
    nemo_keys: ClassVar[dict[str, str]] = _dtensor_keys()
    lora = True
    images = True
    ulysses = True

    def check(self, cfg, problems: Problems) -> None:
        check_rules(cfg, problems, [special_or_at_least_one(f"{key}.fsdp_size", -1, "whole world")
                                    for key in (POLICY_BLOCK, REF_BLOCK, CRITIC_BLOCK)])
        check_ulysses(cfg, problems)
        for model, key, world in (("policy", POLICY_BLOCK, policy_world_size(cfg)),
                                  ("ref", REF_BLOCK, ref_world_size(cfg)),
                                  ("policy", CRITIC_BLOCK, policy_world_size(cfg))):
            size = cfg.blocks[key].fsdp_size
            if size >= 1 and world >= 1 and world % size:
                problems.add(f"{key}.fsdp_size",
                             f"{size} does not divide the {model} world size {world} (trainer.placement.{model}_num_"
                             f"nodes * trainer.placement.{model}_num_gpus_per_node); use -1 (whole world) or a "
                             f"divisor of {world}")

    def backend_options(self, cfg, role: str) -> dict:
        return dataclasses.asdict(cfg.blocks[BLOCK_OF_ROLE[role]])


class FSDPStrategy(FSDP2Strategy):
    name = "fsdp"
    backend = "rl.backends.fsdp:FSDPBackend"
    nemo_flags = ()
    nemo_keys: ClassVar[dict[str, str]] = {}

    def check(self, cfg, problems: Problems) -> None:
        super().check(cfg, problems)
        for block in (POLICY_BLOCK, CRITIC_BLOCK):  # the two trained models
            if cfg.blocks[block].cpu_offload:
                problems.add(block + ".cpu_offload",
                             "cannot be true with trainer.strategy=fsdp: FSDP1 cannot accumulate gradients outside "
                             "no_sync with CPU offload. Use trainer.strategy=fsdp2, or offload only the reference "
                             f"model ({REF_BLOCK}.cpu_offload=true)")


def check_ulysses(cfg, problems: Problems) -> None:
    """`trainer.policy.sequence_parallel_size` > 1 against the world, the model's heads and the options Ulysses
    does not cover."""
    size, key = cfg.trainer.policy.sequence_parallel_size, "trainer.policy.sequence_parallel_size"
    if size <= 1:
        return
    for model, world in (("policy", policy_world_size(cfg)), ("reference", ref_world_size(cfg))):
        if world >= 1 and world % size:
            problems.add(key, f"{size} does not divide the {model}'s {world} workers; pick a divisor")
    if not cfg.trainer.use_sample_packing:
        problems.add(key, f"is {size}, but Ulysses splits packed rows: set trainer.use_sample_packing=true")
    if cfg.trainer.policy.use_fused_kernels:
        problems.add("trainer.policy.use_fused_kernels",
                     f"is true, but the fused loss does not run with sequence parallelism yet "
                     f"({key}={size}); set it to false")
    config = local_model_config(cfg.trainer.policy.model.path)
    problem = head_problem(config, size) if config is not None else None
    if problem:
        problems.add(key, f"{problem} ({cfg.trainer.policy.model.path}/config.json)")


def head_problem(config, size: int) -> str | None:
    """Why a model with this config cannot be split over `size` Ulysses ranks (None: it can)."""
    heads = config.num_attention_heads
    if heads % size:
        return (f"{size} does not divide the model's {heads} attention heads (Ulysses splits them over the group); "
                "pick a divisor")
    return None
