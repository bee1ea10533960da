"""NeMo RL keys whose translation depends on other keys: the backend switches, the optimizer of the selected
backend, lengths, batch sizes, the advantage estimator, the KL term and the policy loss."""

from __future__ import annotations

import types
from typing import Any

from rl.core.config import strategies
from rl.core.config.dialects.apply import LIFTED_ENGINE_ARGUMENTS, move_mapping
from rl.core.config.dialects.layer import MISSING, Layer
from rl.core.config.dialects.nemo import GEN, MC, VLLM, P
from rl.core.config.dialects.skyrl_rules import expert_tensor_parallel

NEMO = "NeMo RL"
OPTIMIZER, _A = "trainer.policy.optimizer_config.", "trainer.algorithm."


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def nemo_or_ours(layer: Layer, theirs: str, ours: str) -> Any:
    """A value given by NeMo RL's key in this layer, else ours as the config has it so far."""
    value = layer.value(theirs)
    return value if value is not MISSING else layer.current(ours)


def emit(layer: Layer, theirs: str, ours: str, value: Any, at: str | None = None, note: str = "") -> None:
    """Our key `ours` set to `value` in place of NeMo RL's `theirs` (or of the item `at`), reported as an alias."""
    layer.emit(ours, value, at=at or theirs)
    layer.alias(theirs, f"{ours}={value!r}", NEMO)
    if note:
        layer.differs(theirs, NEMO, note)


def inert(layer: Layer, keys: dict[str, Any], why: str) -> None:
    for key, value in keys.items():
        if value is not MISSING:
            layer.inert(key, why)


# --- the backend switches ---------------------------------------------------------------------------------------------
def strategy_switches(layer: Layer) -> None:
    """`policy.megatron_cfg.enabled` / `policy.dtensor_cfg.enabled` select the strategy (the highest priority wins
    when several are true, with a warning); a block switched off, or of the strategy that lost, is ignored."""
    flags = {flag: name for name in strategies.STRATEGIES for flag in strategies.STRATEGIES.get(name).nemo_flags}
    given = [key for key in layer.names() if key in flags]
    if not given:
        return
    values = {key: layer.value(key) for key in given}
    for key, value in values.items():
        if not isinstance(value, bool):
            layer.refuse(key, f"expected true or false, got {value!r}; true selects trainer.strategy={flags[key]}")
    enabled = [key for key in given if values[key] is True]
    names = {flags[key] for key in enabled}
    chosen = max(sorted(names), key=lambda name: strategies.STRATEGIES.get(name).nemo_priority) if names else None
    if len(names) > 1:
        layer.problems.warn(f"both {' and '.join(sorted(set(enabled)))} are enabled; using trainer.strategy={chosen}")
    for key in given:
        layer.take(key)
        if enabled and key == enabled[0]:
            layer.emit("trainer.strategy", chosen, at=key)
            layer.alias(key, f"trainer.strategy={chosen}", NEMO)
        block = key.removesuffix(".enabled")
        if values[key] is not True or flags[key] != chosen:
            why = (
                f"{block} is switched off ({key}=false)"
                if values[key] is not True
                else f"{block} belongs to trainer.strategy={flags[key]}, not the chosen {chosen}"
            )
            for other in layer.names(block):
                layer.take(other)
                layer.inert(other, why)


MEGATRON_SWITCH = MC + "enabled"


def megatron_selected(layer: Layer) -> bool:
    """Whether the strategy chosen so far is the one NeMo RL's Megatron switch selects."""
    name = layer.current("trainer.strategy")
    return name in strategies.STRATEGIES and MEGATRON_SWITCH in strategies.STRATEGIES.get(name).nemo_flags


def strategy_aliases() -> dict[str, str]:
    """NeMo RL key -> ours, for the keys the strategies translate themselves (left for the table)."""
    return {
        key: ours for name in strategies.STRATEGIES for key, ours in strategies.STRATEGIES.get(name).nemo_keys.items()
    }


def strategy_keys() -> set[str]:
    return set(strategy_aliases())


# --- lengths and batch sizes ------------------------------------------------------------------------------------------
def lengths(layer: Layer) -> None:
    """NeMo RL bounds prompt + response by `policy.max_total_sequence_length` (seed 003: `policy.max_seq_length`);
    here the prompt has generator.max_prompt_length tokens (longer prompts are truncated) and the response
    generator.max_generate_length, and their sum is that bound."""
    total_keys = [P + "max_total_sequence_length", P + "max_seq_length", VLLM + "max_model_len"]
    given = {key: layer.take(key) for key in total_keys}
    new_tokens, prompt = layer.take(GEN + "max_new_tokens"), layer.take("data.max_input_seq_length")
    totals = [value for value in given.values() if number(value)]
    if not totals:
        if number(new_tokens):
            emit(layer, GEN + "max_new_tokens", "generator.max_generate_length", new_tokens, at=GEN + "max_new_tokens")
        if number(prompt):
            emit(
                layer,
                "data.max_input_seq_length",
                "generator.max_prompt_length",
                prompt,
                at="data.max_input_seq_length",
                note="a longer prompt is cut to this length here as data.truncation says",
            )
        return
    total = int(min(totals))
    budget = prompt if number(prompt) and prompt < total else layer.current("generator.max_prompt_length")
    budget = int(budget) if number(budget) and budget < total else total // 2
    response = total - budget
    if number(new_tokens):
        response = min(response, int(new_tokens))
    anchor = next(key for key, value in given.items() if value is not MISSING)
    layer.emit("generator.max_prompt_length", budget, at=anchor)
    layer.emit("generator.max_generate_length", response, at=anchor)
    named = ", ".join(key for key, value in given.items() if value is not MISSING)
    layer.alias(named, "generator.max_prompt_length + generator.max_generate_length", NEMO)
    layer.differs(
        named,
        NEMO,
        f"NeMo RL bounds prompt + response by {total} tokens; here the prompt gets "
        f"generator.max_prompt_length={budget} (longer prompts are cut as data.truncation says) and the response "
        f"generator.max_generate_length={response}",
    )


def batch_sizes(layer: Layer) -> None:
    """`policy.train_global_batch_size` counts sequences per optimizer step; our policy_mini_batch_size counts
    prompts, each with n samples. Seed 003's `algorithm.batch_size` x `gradient_accumulation_steps` x DP is the
    optimizer step's batch, `batch_size` the sequences of one micro-batch."""
    samples = nemo_or_ours(layer, "grpo.num_generations_per_prompt", "generator.n_samples_per_prompt")
    key = P + "train_global_batch_size"
    sequences = layer.take(key)
    if sequences is not MISSING:
        _mini_batch(layer, key, sequences, samples, f"{sequences} sequences")
    micro, steps = layer.take("algorithm.batch_size"), layer.take("algorithm.gradient_accumulation_steps")
    if micro is MISSING and steps is MISSING:
        return
    if micro is not MISSING:
        emit(layer, "algorithm.batch_size", "trainer.micro_train_batch_size_per_gpu", micro, at="algorithm.batch_size")
    micro = micro if micro is not MISSING else layer.current("trainer.micro_train_batch_size_per_gpu")
    given_steps = steps is not MISSING
    steps = steps if given_steps else 1
    if not (number(micro) and number(steps)):
        layer.refuse(
            "algorithm.gradient_accumulation_steps",
            f"needs whole numbers, got batch_size {micro!r} and gradient_accumulation_steps {steps!r}",
        )
        return
    data_parallel = _data_parallel_size(layer)
    key = "algorithm.gradient_accumulation_steps" if given_steps else "algorithm.batch_size"
    _mini_batch(
        layer,
        key,
        int(micro * steps * data_parallel),
        samples,
        f"batch_size {micro} x gradient_accumulation_steps {steps} x data-parallel size {data_parallel}",
    )


def _mini_batch(layer: Layer, key: str, sequences: Any, samples: Any, what: str) -> None:
    if not (number(sequences) and number(samples)) or sequences % samples:
        layer.refuse(
            key,
            f"{what} per optimizer step must be a multiple of the samples per prompt ({samples!r}); "
            "set trainer.policy_mini_batch_size (prompts per optimizer step) instead",
        )
        return
    prompts = int(sequences // samples)
    layer.emit("trainer.policy_mini_batch_size", prompts, at=key)
    layer.alias(
        key,
        f"trainer.policy_mini_batch_size={prompts} ({what} per optimizer step / {samples} samples per prompt)",
        NEMO,
    )


def _data_parallel_size(layer: Layer) -> int:
    """world / the selected strategy's model-parallel size, from the config as this layer leaves it."""
    nodes = nemo_or_ours(layer, "cluster.num_nodes", "trainer.placement.policy_num_nodes")
    gpus = nemo_or_ours(layer, "cluster.gpus_per_node", "trainer.placement.policy_num_gpus_per_node")
    name = layer.current("trainer.strategy")
    if name not in strategies.STRATEGIES:
        return nodes * gpus
    strategy = strategies.STRATEGIES.get(name)
    theirs = {ours: key for key, ours in strategy_aliases().items()}
    blocks = {}
    for block in strategy.blocks:
        values = dict(layer.current(block))
        for field in values:
            key = f"{block}.{field}"
            values[field] = nemo_or_ours(layer, theirs[key], key) if key in theirs else layer.current(key)
        blocks[block] = types.SimpleNamespace(**values)
    view = types.SimpleNamespace(
        blocks=blocks,
        trainer=types.SimpleNamespace(
            policy=types.SimpleNamespace(sequence_parallel_size=layer.current("trainer.policy.sequence_parallel_size"))
        ),
    )
    size, _ = strategy.model_parallel_size(view)
    return max(1, (nodes * gpus) // max(1, size))


# --- algorithm --------------------------------------------------------------------------------------------------------
def advantages(layer: Layer) -> None:
    """NeMo RL's GRPO baseline: the group mean without the sample itself (leave-one-out) or with it, divided by
    the group's std or not. Without std, leave-one-out is rloo here; with it, grpo (mean with the sample)."""
    block = {key: layer.take(key) for key in layer.names("grpo.adv_estimator")}
    outer = {name: layer.take(f"grpo.{name}") for name in ("normalize_rewards", "use_leave_one_out_baseline")}
    chosen = {}
    for name, value in outer.items():  # the estimator block's own value wins, as in NeMo RL
        inner = block.pop(f"grpo.adv_estimator.{name}", MISSING)
        chosen[name] = inner if inner is not MISSING else value
        if inner is not MISSING and value is not MISSING:
            layer.inert(f"grpo.{name}", f"grpo.adv_estimator.{name} is the value used")
    normalize, loo = chosen["normalize_rewards"], chosen["use_leave_one_out_baseline"]
    name = block.pop("grpo.adv_estimator.name", MISSING)
    inert(layer, block, "used by reinforce_plus_plus only")
    if name == "reinforce_plus_plus":
        emit(
            layer,
            "grpo.adv_estimator.name",
            _A + "advantage_estimator",
            "reinforce++",
            note="reinforce++ here whitens discounted token returns over the batch (SkyRL's); NeMo RL's "
            "reinforce_plus_plus first subtracts the group mean",
        )
        return
    if name not in (MISSING, "grpo"):
        layer.refuse(
            "grpo.adv_estimator.name", f"is {name!r}; the estimators here are in trainer.algorithm.advantage_estimator"
        )
        return
    if normalize is MISSING and loo is MISSING:
        return
    at = "grpo.use_leave_one_out_baseline" if loo is not MISSING else "grpo.normalize_rewards"
    if loo is True and normalize is False:
        emit(layer, at, _A + "advantage_estimator", "rloo")
        return
    if normalize is not MISSING:
        emit(layer, "grpo.normalize_rewards", _A + "grpo_norm_by_std", bool(normalize), at=at)
    if loo is True:
        emit(
            layer,
            at,
            _A + "advantage_estimator",
            "grpo",
            note="the GRPO baseline is the group mean with the sample itself and the std the group's; NeMo RL's "
            "leave-one-out baseline and std give advantages about n/(n-1) times larger (n samples per prompt)",
        )
    elif loo is False:
        emit(layer, at, _A + "advantage_estimator", "grpo")


def kl(layer: Layer) -> None:
    penalty, in_reward = layer.take("loss_fn.reference_policy_kl_penalty"), layer.take("loss_fn.use_kl_in_reward")
    if in_reward is True:
        emit(layer, "loss_fn.use_kl_in_reward", _A + "use_kl_in_reward", True)
        layer.emit(_A + "use_kl_loss", False, at="loss_fn.use_kl_in_reward")
        if penalty is not MISSING:
            emit(layer, "loss_fn.reference_policy_kl_penalty", _A + "kl_loss_coef", penalty)
        return
    if in_reward is False:
        layer.emit(_A + "use_kl_in_reward", False, at="loss_fn.use_kl_in_reward")
    if penalty is not MISSING:
        layer.emit(_A + "use_kl_loss", number(penalty) and penalty > 0, at="loss_fn.reference_policy_kl_penalty")
        emit(layer, "loss_fn.reference_policy_kl_penalty", _A + "kl_loss_coef", penalty)


def policy_loss(layer: Layer) -> None:
    """One policy loss from NeMo RL's switches: dual clip, CISPO, GSPO (sequence-level ratios) or REINFORCE (no
    ratio); the token-level or sequence-level mean."""
    clip_c, cispo = layer.take("loss_fn.ratio_clip_c"), layer.take("loss_fn.use_cispo")
    gspo, no_ratio = layer.take("loss_fn.sequence_level_importance_ratios"), layer.take("loss_fn.disable_ppo_ratio")
    token_level = layer.take("loss_fn.token_level_loss")
    chosen = [
        (key, loss)
        for key, value, loss in (
            ("loss_fn.ratio_clip_c", number(clip_c), "dual_clip"),
            ("loss_fn.use_cispo", cispo is True, "cispo"),
            ("loss_fn.sequence_level_importance_ratios", gspo is True, "gspo"),
            ("loss_fn.disable_ppo_ratio", no_ratio is True, "importance_sampling"),
        )
        if value
    ]
    for key, value in (
        ("loss_fn.ratio_clip_c", clip_c),
        ("loss_fn.use_cispo", cispo),
        ("loss_fn.sequence_level_importance_ratios", gspo),
        ("loss_fn.disable_ppo_ratio", no_ratio),
    ):
        if value in (None, False):
            layer.inert(key, "off")
    if len(chosen) > 1:
        layer.refuse(chosen[1][0], f"cannot be combined with {chosen[0][0]}; keep one policy loss")
    elif chosen:
        key, loss = chosen[0]
        notes = {
            "cispo": "the CISPO weight is min(r, 1 + ratio_clip_max) here; NeMo RL also clamps it below at "
            "1 - ratio_clip_min",
            "importance_sampling": "the loss is -r * A with r = 1 before the first update (the same gradient "
            "as NeMo RL's -A * log p there)",
        }
        emit(layer, key, _A + "policy_loss_type", loss, note=notes.get(loss, ""))
        if loss == "dual_clip":
            layer.emit(_A + "clip_ratio_c", clip_c, at=key)
    if token_level is not MISSING:
        emit(layer, "loss_fn.token_level_loss", _A + "loss_reduction", "token_mean" if token_level else "sequence_mean")


def importance_sampling(layer: Layer) -> None:
    """NeMo RL's off-policy correction of the trainer-vs-generation logprobs: `tis` (weights capped at the ratio),
    `icepop` (tokens outside [min, max] masked); `seq-mask-tis` and uncapped weights are not available."""
    block = "loss_fn.truncated_importance_sampling_"
    used = layer.take("loss_fn.use_importance_sampling_correction")
    kind, high, low = layer.take(block + "type"), layer.take(block + "ratio"), layer.take(block + "ratio_min")
    keys = {
        "loss_fn.use_importance_sampling_correction": used,
        block + "type": kind,
        block + "ratio": high,
        block + "ratio_min": low,
    }
    if used is not True:
        inert(layer, keys, "importance-sampling correction is off")
        return
    opc, at = _A + "off_policy_correction.", "loss_fn.use_importance_sampling_correction"
    if kind == "tis" and number(high) and low in (MISSING, None, 0, 0.0):
        layer.emit(opc + "tis_ratio_type", "token", at=at)
        emit(layer, block + "ratio", opc + "token_tis_ratio_clip_high", high, at=at)
    elif kind == "icepop" and number(high) and number(low):
        layer.emit(opc + "tis_ratio_type", "token", at=at)
        layer.emit(opc + "token_tis_ratio_clip_high", high, at=at)
        layer.emit(opc + "token_mask_is_threshold_low", low, at=at)
        emit(layer, block + "ratio", opc + "token_mask_is_threshold_high", high, at=at)
    else:
        layer.refuse(
            at,
            f"with truncated_importance_sampling_type={kind!r}, ratio={high!r}, ratio_min={low!r}: only "
            "tis (ratio set, ratio_min 0) and icepop (both set) are available here "
            f"({opc}*); uncapped weights and seq-mask-tis are not",
        )


def precision(layer: Layer) -> None:
    key = P + "precision"
    value = layer.take(key)
    if value is MISSING:
        return
    if value in ("bfloat16", "bf16"):
        emit(layer, key, "trainer.bf16", True)
    elif value in ("float32", "fp32"):
        emit(layer, key, "trainer.bf16", False)
    else:
        layer.refuse(key, f"is {value!r}; training here is bfloat16 (trainer.bf16=true) or float32 (false)")


def megatron_recompute(layer: Layer) -> None:
    """`activation_checkpointing` turns recomputation on; `recompute_granularity` and `recompute_modules` say what
    it recomputes (and mean nothing while it is off)."""
    checkpointing = layer.take(MC + "activation_checkpointing")
    granularity, modules = layer.take(MC + "recompute_granularity"), layer.take(MC + "recompute_modules")
    block = "trainer.policy.megatron_config."
    if checkpointing is MISSING and granularity is MISSING and modules is MISSING:
        return
    if checkpointing is not True:
        if checkpointing is False:
            emit(layer, MC + "activation_checkpointing", "trainer.gradient_checkpointing", False)
        inert(
            layer,
            {MC + "recompute_granularity": granularity, MC + "recompute_modules": modules},
            "used only with activation_checkpointing=true",
        )
        return
    emit(layer, MC + "activation_checkpointing", "trainer.gradient_checkpointing", True)
    if granularity is not MISSING:
        emit(layer, MC + "recompute_granularity", block + "recompute_granularity", granularity)
    if isinstance(modules, list):
        layer.emit(block + "transformer_config_kwargs.recompute_modules", modules, at=MC + "recompute_modules")
        layer.alias(MC + "recompute_modules", block + "transformer_config_kwargs.recompute_modules", NEMO)
    elif modules is not MISSING:
        layer.inert(MC + "recompute_modules", "null: Megatron-Core's default modules")


def megatron_layout(layer: Layer) -> None:
    """ETP, gradient reduction precision and the MoE router knobs (which mean nothing for dense models)."""
    expert_tensor_parallel(layer, MC + "expert_tensor_parallel_size")
    reduce = layer.take(MC + "distributed_data_parallel_config.grad_reduce_in_fp32")
    if reduce is False:
        layer.differs(
            MC + "distributed_data_parallel_config.grad_reduce_in_fp32",
            NEMO,
            "gradients are reduced in float32 here (NeMo RL reduces them in bf16)",
        )
    elif reduce is True:
        layer.inert(MC + "distributed_data_parallel_config.grad_reduce_in_fp32", "as here")
    defaults = {
        "freeze_moe_router": False,
        "moe_router_dtype": None,
        "moe_router_load_balancing_type": "none",
        "moe_router_bias_update_rate": 0.0,
    }
    for name, default in defaults.items():
        key = MC + name
        value = layer.take(key)
        if value is MISSING:
            continue
        if value == default or (name == "moe_router_dtype" and value in ("fp32", "float32")):
            layer.inert(key, "as here")
            continue
        layer.later(key, _dense_only(layer, key, value))
        layer.inert(key, "MoE routing: nothing to route in a dense model (checked)")


def _dense_only(layer: Layer, key: str, value: Any):
    """Accepted for a dense model; refused for a model with experts; for a model without a local config.json
    (a hub name), accepted with the difference printed."""
    report = layer.report

    def check(cfg) -> str | None:
        path = cfg.trainer.policy.model.path
        model = strategies.local_model_config(path)
        if model is None:
            report.differs.append(
                f"{key} ({NEMO}): {value!r} is not applied: if {path} has experts, its routers "
                "train here with Megatron-Core's router settings (a dense model has no router)"
            )
            return None
        if not (getattr(model, "num_local_experts", None) or getattr(model, "num_experts", None)):
            return None
        return (
            f"is {value!r}, but {path} has experts, whose routers train here with Megatron-Core's router "
            "settings; remove it, or pass the setting in trainer.policy.megatron_config.transformer_config_kwargs"
        )

    return check


def engine_kwargs(layer: Layer) -> None:
    """`policy.generation.vllm_kwargs`: further arguments of every vLLM engine, as generator.engine_init_kwargs."""
    move_mapping(layer, GEN + "vllm_kwargs", "generator.engine_init_kwargs", NEMO, LIFTED_ENGINE_ARGUMENTS)


RULES = (
    engine_kwargs,
    lengths,
    batch_sizes,
    advantages,
    kl,
    policy_loss,
    importance_sampling,
    precision,
    megatron_recompute,
    megatron_layout,
)
"""After strategy_switches and the optimizer (nemo_optimizer.py), which need the chosen strategy."""
