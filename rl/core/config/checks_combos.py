"""Checks of values that must agree with each other: batch arithmetic, parallel layout, algorithm needs."""

from __future__ import annotations

from rl.core.config import choices, strategies
from rl.core.config.errors import Problems
from rl.core.config.parallel import group_placement, parallel_sizes
from rl.core.config.schema import Config


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
            f"data-parallel size {sizes.data_parallel} ({sizes.how}) = {per_step}; "
            + mini_batch_fix("trainer.policy_mini_batch_size", train, mini, n, micro, sizes.data_parallel),
        )


def mini_batch_fix(key: str, train: int, mini: int, n: int, micro: int, data_parallel: int) -> str:
    """What to set so that `mini` prompts x `n` samples split into micro-batches of `micro` on each of
    `data_parallel` ranks, `mini` dividing `train`: the nearest such mini-batch size, and the largest micro-batch
    size that fits the mini-batch as it is."""
    minis = sorted((m for m in range(1, train + 1) if train % m == 0 and (m * n) % (micro * data_parallel) == 0),
                   key=lambda m: (abs(m - mini), m))
    micros = [u for u in range(micro, 0, -1) if (mini * n) % (u * data_parallel) == 0]
    fixes = [f"{key}={minis[0]}"] if minis else []
    fixes += [f"trainer.micro_train_batch_size_per_gpu={micros[0]}"] if micros else []
    if not fixes:
        return "change the data-parallel size (the devices or the model-parallel sizes)"
    return "e.g. set " + " or ".join(fixes)


def check_token_budget(cfg: Config, problems: Problems) -> None:
    """A packed micro-batch must hold the longest sequence a rollout can make (prompt + generation limits), or the
    first long rollout would stop the run after generation."""
    budget, gen = cfg.trainer.max_tokens_per_micro_batch, cfg.generator
    longest = gen.max_prompt_length + gen.max_generate_length
    if budget is not None and cfg.trainer.use_sample_packing and 1 <= budget < longest:
        problems.add(
            "trainer.max_tokens_per_micro_batch",
            f"{budget} is smaller than the longest possible sequence, generator.max_prompt_length "
            f"{gen.max_prompt_length} + generator.max_generate_length {gen.max_generate_length} = {longest}; raise "
            f"it to at least {longest} or lower those limits",
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
    if cfg.trainer.algorithm.zero_variance_filter and n == 1:
        problems.add("trainer.algorithm.zero_variance_filter", "is true with generator.n_samples_per_prompt=1: a "
                     "prompt with one sample has nothing to compare and is kept, so it would do nothing; turn it off "
                     "or sample 2 or more per prompt")


def check_colocation(cfg: Config, problems: Problems) -> None:
    """The reference model runs on the policy's workers (with colocate_all, on the same devices as everything), so
    their placements must be equal; overlapping generation with training needs engines on devices of their own."""
    placement = cfg.trainer.placement
    policy = (placement.policy_num_nodes, placement.policy_num_gpus_per_node)
    ref = group_placement(cfg, "ref")
    fix = (f"set trainer.placement.ref_num_nodes={policy[0]} and trainer.placement.ref_num_gpus_per_node="
           f"{policy[1]} (or leave both null)")
    if placement.colocate_all and policy != ref:
        problems.add(
            "trainer.placement.colocate_all",
            f"is true but the reference placement {ref[0]}x{ref[1]} (ref_num_nodes x ref_num_gpus_per_node) "
            f"differs from the policy's {policy[0]}x{policy[1]}; {fix}",
        )
    elif policy != ref and placement.colocate_policy_ref:
        problems.add(
            "trainer.placement.ref_num_gpus_per_node",
            f"gives the reference model {ref[0]}x{ref[1]} devices, but with trainer.placement.colocate_policy_ref="
            f"true it runs on the policy's workers ({policy[0]}x{policy[1]}); {fix}, or set colocate_policy_ref=false",
        )
    if not placement.colocate_policy_ref:
        if placement.colocate_all:
            problems.add("trainer.placement.colocate_policy_ref",
                         "is false, but trainer.placement.colocate_all=true puts every model on the same devices; "
                         "set trainer.placement.colocate_all=false for a reference group of its own")
        elif not (cfg.trainer.algorithm.use_kl_loss or cfg.trainer.algorithm.use_kl_in_reward):
            problems.add("trainer.placement.colocate_policy_ref",
                         "is false, but with trainer.algorithm.use_kl_loss=false and use_kl_in_reward=false there "
                         "is no reference model to place; leave it true")
        elif (strategy := strategies.selected(cfg)) is not None:
            size, key = strategy.model_parallel_size(cfg)
            if size >= 1 and (ref[0] * ref[1]) % size:
                problems.add("trainer.placement.ref_num_gpus_per_node",
                             f"the reference group's {ref[0]}x{ref[1]} devices are not a multiple of the "
                             f"model-parallel size {size} ({key}); give it a multiple")
    if cfg.trainer.fully_async.enabled and placement.colocate_all:
        problems.add(
            "trainer.fully_async.enabled",
            "is true, but with trainer.placement.colocate_all=true the engines share the workers' devices and wait "
            "for them; set trainer.placement.colocate_all=false to give the engines devices of their own",
        )
    if cfg.trainer.fully_async.partial_rollout_tokens and not cfg.trainer.fully_async.enabled:
        problems.add("trainer.fully_async.partial_rollout_tokens",
                     f"is {cfg.trainer.fully_async.partial_rollout_tokens}, but partial rollouts take weights pushed "
                     "while the engines generate ahead, which only trainer.fully_async.enabled=true does; set it to "
                     "0 or enable trainer.fully_async")


def check_off_policy_bounds(cfg: Config, problems: Problems) -> None:
    """Each low/high pair of trainer.algorithm.off_policy_correction is ordered, and token masking has both bounds
    (one alone would do nothing)."""
    key, opc = "trainer.algorithm.off_policy_correction.", cfg.trainer.algorithm.off_policy_correction
    for low, high in (("geo_mask_low", "geo_mask_high"), ("product_mask_low", "product_mask_high"),
                      ("outlier_token_is_threshold_low", "outlier_token_is_threshold_high"),
                      ("token_mask_is_threshold_low", "token_mask_is_threshold_high")):
        lo, hi = getattr(opc, low), getattr(opc, high)
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo >= hi:
            problems.add(key + low, f"{lo} must be below {key}{high} ({hi})")
    low, high = opc.token_mask_is_threshold_low, opc.token_mask_is_threshold_high
    if (low is None) != (high is None):
        unset = "token_mask_is_threshold_high" if high is None else "token_mask_is_threshold_low"
        problems.add(key + unset, "is null, but token masking needs both token_mask_is_threshold_low and "
                     "token_mask_is_threshold_high; set it, or set the other one to null")


def check_kl_and_policy_loss(cfg: Config, problems: Problems) -> None:
    """The KL penalty goes in the loss or in the reward, not both (as in SkyRL); the clip_cov bounds are ordered;
    TIS weights, applied through the advantages, need a loss linear in each token's advantage."""
    algorithm, key = cfg.trainer.algorithm, "trainer.algorithm."
    if algorithm.use_kl_in_reward and algorithm.use_kl_loss:
        problems.add(key + "use_kl_in_reward", "is true together with trainer.algorithm.use_kl_loss=true (the "
                     "default); the KL penalty goes in the reward or in the loss, not both: set "
                     "trainer.algorithm.use_kl_loss=false, or use_kl_in_reward=false")
    bounds = algorithm.clip_cov
    if bounds.clip_cov_lb >= bounds.clip_cov_ub:
        problems.add(key + "clip_cov.clip_cov_lb", f"{bounds.clip_cov_lb} must be below "
                     f"trainer.algorithm.clip_cov.clip_cov_ub ({bounds.clip_cov_ub})")
    tis, loss = algorithm.off_policy_correction.tis_ratio_type, algorithm.policy_loss_type
    if tis is not None and loss in choices.COVARIANCE_POLICY_LOSSES:
        problems.add(key + "off_policy_correction.tis_ratio_type", f"is {tis}, but trainer.algorithm."
                     f"policy_loss_type={loss} picks its tokens from the advantages, which carry the TIS weights "
                     "(and SkyRL applies no correction to it); set tis_ratio_type=null (the masks still apply) or "
                     "choose another policy_loss_type")


def check_weight_sync_backend(cfg: Config, problems: Problems) -> None:
    """An explicit transport must be one the placement uses: collectives need engines on devices of their own, and
    the colocated HF engine (in the driver) has no transport to choose."""
    gen, separate = cfg.generator, not cfg.trainer.placement.colocate_all
    key, chosen = "generator.weight_sync_backend", cfg.generator.weight_sync_backend
    if chosen is None or separate:
        return
    if gen.backend == "hf":
        problems.add(key, f"is {chosen}, but the colocated HF engine runs in the driver and takes rank 0's weights "
                     "through Ray; leave it null, or set trainer.placement.colocate_all=false")
    elif chosen in ("gloo", "nccl"):
        problems.add(key, f"is {chosen}, but a process group between rank 0 and engines sharing its devices is not "
                     "possible (nccl allows one rank per device); use ipc or ray, or set "
                     "trainer.placement.colocate_all=false")


ENGINE_ARGUMENTS_OF_KEYS = {
    "model": "trainer.policy.model.path", "tokenizer": "trainer.policy.model.path",
    "tensor_parallel_size": "generator.inference_engine_tensor_parallel_size",
    "gpu_memory_utilization": "generator.gpu_memory_utilization",
    "kv_cache_memory_bytes": "generator.kv_cache_memory_bytes",
    "enable_prefix_caching": "generator.enable_prefix_caching",
    "max_num_batched_tokens": "generator.max_num_batched_tokens", "max_num_seqs": "generator.max_num_seqs",
    "max_model_len": "generator.max_prompt_length + generator.max_generate_length", "seed": "trainer.seed",
}
"""`vllm.LLM` arguments set from keys of ours."""
ENGINE_ARGUMENTS_KEPT = {
    "logprobs_mode": "the trainer's ratios and checks use the logprobs after temperature and top-p/k",
    "enable_sleep_mode": "sleep follows the placement (engines sharing the training GPUs sleep while they train)",
    "worker_extension_cls": "weight sync loads the policy's weights through this project's worker extension",
    "distributed_executor_backend": "an engine's tensor-parallel workers are placed by the placement group",
}
"""`vllm.LLM` arguments the trainer sets for itself."""


def check_engine_kwargs(cfg: Config, problems: Problems) -> None:
    """generator.engine_init_kwargs go to vLLM only, never in place of a key of ours or
    an argument the trainer sets (the names vLLM knows are checked in preflight, where vLLM may be imported)."""
    key, extra = "generator.engine_init_kwargs", cfg.generator.engine_init_kwargs
    if extra and cfg.generator.backend != "vllm":
        problems.add(key, f"are {extra}, arguments of vllm.LLM, but generator.backend={cfg.generator.backend}; "
                     "remove them or set generator.backend=vllm")
        return
    for name in extra:
        if name in ENGINE_ARGUMENTS_OF_KEYS:
            problems.add(f"{key}.{name}", f"is set by {ENGINE_ARGUMENTS_OF_KEYS[name]}: give that instead")
        elif name in ENGINE_ARGUMENTS_KEPT:
            problems.add(f"{key}.{name}", f"is set by the trainer: {ENGINE_ARGUMENTS_KEPT[name]}; remove it")


def check_engine_devices(cfg: Config, problems: Problems) -> None:
    """vLLM engines are colocated with the policy's workers: engines * engine TP must divide their devices."""
    gen = cfg.generator
    if gen.backend != "vllm" or min(gen.num_inference_engines, gen.inference_engine_tensor_parallel_size) < 1:
        return
    if not cfg.trainer.placement.colocate_all:
        return  # devices of their own: whether the cluster has them is checked before Ray starts
    from rl.core.config.parallel import policy_world_size

    world, per_engine, engines = policy_world_size(cfg), gen.inference_engine_tensor_parallel_size, \
        gen.num_inference_engines
    if world < 1:
        return
    where = (f"the policy's {world} devices (trainer.placement.policy_num_nodes x policy_num_gpus_per_node), which "
             "colocated engines share")
    if world % per_engine:
        fits = max(tp for tp in range(1, per_engine + 1) if world % tp == 0)
        problems.add("generator.inference_engine_tensor_parallel_size",
                     f"is {per_engine}, which does not divide {where}; set it to {fits} (a divisor of {world}), or "
                     "set trainer.placement.colocate_all=false to give the engines devices of their own")
    elif engines * per_engine > world:
        problems.add("generator.num_inference_engines",
                     f"{engines} engines x inference_engine_tensor_parallel_size {per_engine} = "
                     f"{engines * per_engine} devices, more than {where}; set it to {world // per_engine} at most, "
                     "or set trainer.placement.colocate_all=false to give the engines devices of their own")


def check_reward_shaping(cfg: Config, problems: Problems) -> None:
    """Dynamic sampling needs groups and a loop that can draw more batches; the overlong band fits the budget."""
    algorithm, generator = cfg.trainer.algorithm, cfg.generator
    sampling = algorithm.dynamic_sampling.type
    if sampling is not None and generator.n_samples_per_prompt < 2:
        problems.add("trainer.algorithm.dynamic_sampling.type", f"is {sampling}, but with "
                     "generator.n_samples_per_prompt=1 there are no groups to compare; sample >= 2 per prompt or "
                     "set it to null")
    band = algorithm.overlong_buffer.len
    if band >= generator.max_generate_length:
        problems.add("trainer.algorithm.overlong_buffer.len", f"is {band}, not below generator.max_generate_length="
                     f"{generator.max_generate_length}: the penalty would start at the first token; make it smaller")


def check_environment(cfg: Config, problems: Problems) -> None:
    """Turns need an environment to answer them; episodes are generated in the step that trains on them."""
    env, generator = cfg.environment, cfg.generator
    check_agent(cfg, problems)
    if env.env_class is None:
        if generator.max_turns > 1 and env.agent_fn is None:
            problems.add("generator.max_turns", f"is {generator.max_turns}, but without environment.env_class "
                         "nothing answers the policy between turns; set an environment (e.g. arith_retry) or 1")
        if env.env_options:
            problems.add("environment.env_options", "are given, but environment.env_class is null; set the class "
                         "they are for, or remove them")
        return


def check_agent(cfg: Config, problems: Problems) -> None:
    """An agent plays its episodes through the endpoint, so each needs the other; it replaces the environment."""
    env, generator = cfg.environment, cfg.generator
    if env.agent_fn is None:
        if generator.enable_http_endpoint:
            problems.add("generator.enable_http_endpoint", "is true, but environment.agent_fn is null, so nothing "
                         "would call the endpoint; set the agent (path/to/file.py:run) or set it to false")
        return
    if not generator.enable_http_endpoint:
        problems.add("environment.agent_fn", "plays its episodes through the OpenAI-compatible endpoint; set "
                     "generator.enable_http_endpoint=true")
    if env.env_class is not None:
        problems.add("environment.agent_fn", f"and environment.env_class ({env.env_class}) both play the episodes; "
                     "set one of them to null")
    if generator.served_model_name is not None and not generator.served_model_name.strip():
        problems.add("generator.served_model_name", "is empty; give the name agents send as `model`, or null for the "
                     "policy's model path")
    if not is_loopback(generator.http_endpoint_host) and generator.http_endpoint_api_key_file is None:
        problems.add("generator.http_endpoint_host", f"is {generator.http_endpoint_host}, which other machines can "
                     "reach: give generator.http_endpoint_api_key_file (a file whose first line is the key the "
                     "agents send), or listen on 127.0.0.1")


def is_loopback(host: str) -> bool:
    """An address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_reward_models(cfg: Config, problems: Problems) -> None:
    """A model of trainer.reward counts only when data.reward_fn names it, and a name needs its model."""
    listed, reward = cfg.data.reward_fn, cfg.trainer.reward
    judge = reward.judge
    configured = {"reward_model": {"trainer.reward.model.path": reward.model.path},
                  "llm_judge": {"trainer.reward.judge.model_path": judge.model_path,
                                "trainer.reward.judge.template": judge.template,
                                "trainer.reward.judge.pattern": judge.pattern}}
    for name, keys in configured.items():
        missing = [key for key, value in keys.items() if value is None]
        if name in listed:
            for key in missing:
                problems.add(key, f"is null, but data.reward_fn lists {name}; set it (see its documentation)")
        elif len(missing) < len(keys):
            first = next(key for key, value in keys.items() if value is not None)
            problems.add(first, f"is set, but data.reward_fn does not list {name}, so it would score nothing; add "
                         f"{name} to data.reward_fn (and a weight to data.reward_weights) or set it to null")


def check_lora(cfg: Config, problems: Problems) -> None:
    """A LoRA policy is its own reference model (adapters off): there is no separate one to place."""
    if cfg.trainer.policy.model.lora.rank > 0 and not cfg.trainer.placement.colocate_policy_ref:
        problems.add("trainer.placement.colocate_policy_ref", "is false, but with LoRA (trainer.policy.model.lora."
                     "rank > 0) the reference model is the policy with its adapters off, on the policy's workers; "
                     "leave it true")
