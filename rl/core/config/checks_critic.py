"""Checks of the critic's keys (`trainer.critic`, its placement and batch sizes, PPO epochs, the critic warm-up).

A critic exists only for `advantage_estimator=gae`; its keys set otherwise would train nothing, so they are refused.
"""

from __future__ import annotations

from rl.core.config import strategies
from rl.core.config.checks_combos import mini_batch_fix
from rl.core.config.errors import Problems
from rl.core.config.parallel import critic_has_own_group, group_placement, parallel_sizes
from rl.core.config.schema import Config

_CRITIC = "trainer.critic."


def check_critic(cfg: Config, problems: Problems) -> None:
    trainer = cfg.trainer
    critic = trainer.critic
    if trainer.update_epochs_per_batch < 1:
        problems.add("trainer.update_epochs_per_batch", f"must be >= 1, got {trainer.update_epochs_per_batch}")
    if trainer.critic_warmup < 0:
        problems.add("trainer.critic_warmup", f"must be >= 0, got {trainer.critic_warmup}")
    if trainer.algorithm.advantage_estimator != "gae":
        for key, value in ((_CRITIC + "model.path", critic.model.path),
                           ("trainer.critic_mini_batch_size", trainer.critic_mini_batch_size),
                           ("trainer.critic_warmup", trainer.critic_warmup or None)):
            if value is not None:
                problems.add(key, f"is set, but only trainer.algorithm.advantage_estimator=gae trains a critic "
                                  f"(it is {trainer.algorithm.advantage_estimator}); unset it or use gae")
        return
    strategy = strategies.selected(cfg)
    if critic.model.lora.rank > 0 and strategy is not None and not strategy.lora:
        adapters = ", ".join(name for name in strategies.STRATEGIES.names() if strategies.STRATEGIES.get(name).lora)
        problems.add(_CRITIC + "model.lora.rank", f"is {critic.model.lora.rank}, but the {strategy.name} backend does "
                     f"not train LoRA adapters; set it to 0 for a critic trained whole, or pick a strategy that "
                     f"trains them ({adapters})")
    if critic_has_own_group(cfg):
        _check_own_group(cfg, strategy, problems)
    else:
        _check_colocated(cfg, problems)
    opt = critic.optimizer_config
    for name in ("lr", "weight_decay", "max_grad_norm", "lr_warmup_steps"):
        if getattr(opt, name) < 0:
            problems.add(_CRITIC + f"optimizer_config.{name}", f"must be >= 0, got {getattr(opt, name)}")
    _check_mini_batch(cfg, problems)


def _check_colocated(cfg: Config, problems: Problems) -> None:
    """With trainer.placement.colocate_all=true the critic runs on the policy's workers and data shards (SkyRL
    asserts the same sizes)."""
    trainer, placement = cfg.trainer, cfg.trainer.placement
    if trainer.critic.sequence_parallel_size != trainer.policy.sequence_parallel_size:
        problems.add(_CRITIC + "sequence_parallel_size",
                     f"{trainer.critic.sequence_parallel_size} differs from trainer.policy.sequence_parallel_size="
                     f"{trainer.policy.sequence_parallel_size}; with trainer.placement.colocate_all=true the critic "
                     "runs on the policy's workers and data shards, so set them equal (or colocate_all=false for a "
                     "critic group of its own)")
    for name, policy in (("num_nodes", placement.policy_num_nodes),
                         ("num_gpus_per_node", placement.policy_num_gpus_per_node)):
        value = getattr(placement, f"critic_{name}")
        if value is not None and value != policy:
            problems.add(f"trainer.placement.critic_{name}",
                         f"{value} differs from trainer.placement.policy_{name}={policy}: with "
                         "trainer.placement.colocate_all=true the critic runs on the policy's workers; set it equal "
                         "or null, or set colocate_all=false for a critic group of its own")


def _check_own_group(cfg: Config, strategy, problems: Problems) -> None:
    """A critic group of its own: at least one device, a multiple of its model-parallel size, Ulysses only where the
    strategy runs it (`strategy`: the selected one, or None when the strategy itself is at fault)."""
    nodes, gpus = group_placement(cfg, "critic")
    if nodes < 1 or gpus < 1:
        problems.add("trainer.placement.critic_num_gpus_per_node" if gpus < 1 else "trainer.placement.critic_num_nodes",
                     f"the critic group of {nodes} x {gpus} devices needs at least one; set both >= 1")
        return
    if strategy is None:
        return
    ulysses = cfg.trainer.critic.sequence_parallel_size
    if ulysses > 1 and not strategy.ulysses:
        problems.add(_CRITIC + "sequence_parallel_size",
                     f"is {ulysses}, but the {strategy.name} backend does not implement Ulysses sequence "
                     "parallelism; set it to 1")
    size, how = strategy.model_parallel_size(cfg, "critic")
    if size >= 1 and (nodes * gpus) % size:
        problems.add("trainer.placement.critic_num_gpus_per_node",
                     f"the critic group's {nodes}x{gpus} devices are not a multiple of its model-parallel size "
                     f"{size} ({how}); give it a multiple")


def _check_mini_batch(cfg: Config, problems: Problems) -> None:
    trainer = cfg.trainer
    mini = trainer.critic_mini_batch_size
    if mini is None:
        return
    train = trainer.train_batch_size
    if mini < 1 or train % mini:
        divisors = [m for m in range(1, train + 1) if train % m == 0]
        nearest = min(divisors, key=lambda m: (abs(m - mini), m)) if divisors else 1
        problems.add("trainer.critic_mini_batch_size",
                     f"{mini} must be >= 1 and divide trainer.train_batch_size={train}; e.g. set it to {nearest}, "
                     "or null for the policy's mini-batch size")
        return
    sizes = parallel_sizes(cfg, "critic")
    n, micro = cfg.generator.n_samples_per_prompt, trainer.micro_train_batch_size_per_gpu
    if sizes is not None and (mini * n) % (micro * sizes.data_parallel):
        problems.add("trainer.critic_mini_batch_size",
                     f"critic_mini_batch_size {mini} * generator.n_samples_per_prompt {n} = {mini * n} sequences "
                     f"per critic step must be a multiple of trainer.micro_train_batch_size_per_gpu {micro} * "
                     f"data-parallel size {sizes.data_parallel} = {micro * sizes.data_parallel}; "
                     + mini_batch_fix("trainer.critic_mini_batch_size", train, mini, n, micro, sizes.data_parallel))
