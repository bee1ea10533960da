"""Checks of values that must agree with each other: batch arithmetic, parallel layout, algorithm needs."""

from __future__ import annotations

from rl.core.config.errors import Problems
from rl.core.config.parallel import parallel_sizes, policy_world_size, ref_placement, ref_world_size
from rl.core.config.schema import Config

_WORLD = "trainer.placement.policy_num_nodes * trainer.placement.policy_num_gpus_per_node"
_MEGATRON = "trainer.policy.megatron_config."


def check_batch_sizes(cfg: Config, problems: Problems) -> None:
    """train_batch_size % policy_mini_batch_size == 0, and
    (policy_mini_batch_size * n_samples_per_prompt) % (micro_train_batch_size_per_gpu * data-parallel size) == 0."""
    trainer = cfg.trainer
    train, mini = trainer.train_batch_size, trainer.policy_mini_batch_size
    micro = trainer.micro_train_batch_size_per_gpu
    n = cfg.generator.n_samples_per_prompt
    if min(train, mini, micro, n) < 1:
        return
    if train % mini:
        nearest = mini * max(1, round(train / mini))
        problems.add(
            "trainer.train_batch_size",
            f"{train} prompts per step is not a multiple of trainer.policy_mini_batch_size={mini}; make it "
            f"one (e.g. {nearest}) or change trainer.policy_mini_batch_size",
        )
    sizes = parallel_sizes(cfg)
    if sizes is None:
        return
    per_step = micro * sizes.data_parallel
    if (mini * n) % per_step:
        problems.add(
            "trainer.policy_mini_batch_size",
            f"policy_mini_batch_size {mini} * generator.n_samples_per_prompt {n} = {mini * n} sequences per "
            f"optimizer step must be a multiple of trainer.micro_train_batch_size_per_gpu {micro} * "
            f"data-parallel size {sizes.data_parallel} ({sizes.how}) = {per_step}; change one of these",
        )


def check_megatron_layout(cfg: Config, problems: Problems) -> None:
    """megatron-core's rule: world % (TP * PP) == 0 (dense DP = world / (TP * PP)); with EP > 1 and the expert
    tensor-parallel size equal to TP, also world % (TP * EP * PP) == 0 (expert DP = world / (TP * EP * PP))."""
    if cfg.trainer.strategy != "megatron":
        return
    mc = cfg.trainer.policy.megatron_config
    tp, pp, ep = mc.tensor_model_parallel_size, mc.pipeline_model_parallel_size, mc.expert_model_parallel_size
    world = policy_world_size(cfg)
    if min(tp, pp, ep, world) < 1:
        return
    if world % (tp * pp):
        problems.add(
            _MEGATRON + "tensor_model_parallel_size",
            f"TP {tp} * PP {pp} = {tp * pp} must divide the world size {world} ({_WORLD}); the dense "
            "data-parallel size is world / (TP * PP). Change TP, PP or the placement",
        )
    elif ep > 1 and world % (tp * ep * pp):
        problems.add(
            _MEGATRON + "expert_model_parallel_size",
            f"with expert parallelism, TP {tp} * EP {ep} * PP {pp} = {tp * ep * pp} must divide the world size "
            f"{world} ({_WORLD}): the expert data-parallel size is world / (ETP * EP * PP), where the expert "
            "tensor-parallel size ETP equals TP. Change EP, TP, PP or the placement",
        )
    if mc.sequence_parallel and tp == 1:
        problems.add(
            _MEGATRON + "sequence_parallel",
            "needs tensor_model_parallel_size > 1 (it shards activations "
            "over the TP group); set it to false or raise TP",
        )


def check_sequence_parallel(cfg: Config, problems: Problems) -> None:
    """For fsdp, fsdp2 and deepspeed the Ulysses sequence-parallel size must divide the world size."""
    size, world = cfg.trainer.policy.sequence_parallel_size, policy_world_size(cfg)
    if cfg.trainer.strategy == "megatron" or min(size, world) < 1 or world % size == 0:
        return
    problems.add(
        "trainer.policy.sequence_parallel_size",
        f"{size} does not divide the world size {world} ({_WORLD}); use a divisor of the world size",
    )


def check_fsdp_sizes(cfg: Config, problems: Problems) -> None:
    """fsdp_size is -1 (whole world) or divides the world of its model."""
    if cfg.trainer.strategy not in ("fsdp", "fsdp2"):
        return
    for model, world in (("policy", policy_world_size(cfg)), ("ref", ref_world_size(cfg))):
        size = getattr(cfg.trainer, model).fsdp_config.fsdp_size
        if size >= 1 and world >= 1 and world % size:
            problems.add(
                f"trainer.{model}.fsdp_config.fsdp_size",
                f"{size} does not divide the {model} world size {world} (trainer.placement.{model}_num_nodes"
                f" * trainer.placement.{model}_num_gpus_per_node); use -1 (whole world) or a divisor of "
                f"{world}",
            )


def check_group_advantages(cfg: Config, problems: Problems) -> None:
    """grpo and rloo compare samples of one prompt, so they need n_samples_per_prompt >= 2."""
    estimator, n = cfg.trainer.algorithm.advantage_estimator, cfg.generator.n_samples_per_prompt
    reasons = {
        "grpo": "grpo normalizes rewards within each prompt's group, so with one sample every advantage is zero",
        "rloo": "rloo's leave-one-out baseline needs at least two samples per prompt",
    }
    if estimator in reasons and n == 1:
        problems.add(
            "generator.n_samples_per_prompt",
            f"is 1 but {reasons[estimator]}; set it to 2 or more, or "
            "choose trainer.algorithm.advantage_estimator=reinforce++",
        )


def check_colocation(cfg: Config, problems: Problems) -> None:
    """colocate_all puts policy and reference on the same devices, so their placements must be equal."""
    placement = cfg.trainer.placement
    policy = (placement.policy_num_nodes, placement.policy_num_gpus_per_node)
    ref = ref_placement(cfg)
    if placement.colocate_all and policy != ref:
        problems.add(
            "trainer.placement.colocate_all",
            f"is true but the reference placement {ref[0]}x{ref[1]} (ref_num_nodes x ref_num_gpus_per_node) "
            f"differs from the policy's {policy[0]}x{policy[1]}; set trainer.placement.ref_num_nodes="
            f"{policy[0]} and trainer.placement.ref_num_gpus_per_node={policy[1]} (or leave both null)",
        )
