"""SkyRL keys whose translation depends on their value or on other keys: values SkyRL spells differently on keys we
share, and keys accepted only when they agree with the rest of the config (checked on the built config)."""

from __future__ import annotations

from typing import Any

from rl.core.config.defaults import get
from rl.core.config.dialects.apply import LIFTED_ENGINE_ARGUMENTS, move_mapping
from rl.core.config.dialects.layer import MISSING, Layer
from rl.core.config.dialects.skyrl import ESP, IE, MEGATRON, REF_LAYOUT, G, T

SKYRL = "SkyRL"
SKYRL_GYM_ENVIRONMENTS = ("text2sql", "search", "lcb", "searchcode", "aime")
"""SkyRL-gym's registered environments that are not built in here (`gsm8k` is the single-turn gsm8k_skyrl reward,
`gsm8k_multi_turn` the built-in environment of that name)."""
MISSING_LOSSES = {
    "dppo": "DPPO's divergence-masked loss",
    "cross_entropy": "a cross-entropy (supervised) policy loss",
}
MISSING_REDUCTIONS = {
    "prompt_mean": "the per-prompt token mean",
    "token_mean_legacy": "SkyRL's former token mean (normalized per micro-batch)",
}


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def intervals(layer: Layer) -> None:
    """SkyRL's -1 "never" for the intervals we share is our 0."""
    for name in ("ckpt_interval", "hf_save_interval", "eval_interval"):
        key = T + name
        value = layer.value(key)
        if _int(value) and value < 0:
            layer.take(key)
            layer.emit(key, 0)
            layer.alias(f"{key}={value}", f"{key}=0", SKYRL)


def resume(layer: Layer) -> None:
    """`resume_mode=null` is `none`; `resume_mode=from_path` with `resume_path=P` is `resume_mode=P`."""
    mode, path = layer.value(T + "resume_mode"), layer.value(T + "resume_path")
    if mode is None:
        layer.take(T + "resume_mode")
        layer.emit(T + "resume_mode", "none")
        layer.alias(f"{T}resume_mode=null", f"{T}resume_mode=none", SKYRL)
    elif mode == "from_path":
        layer.take(T + "resume_mode")
        if path in (MISSING, None):
            layer.refuse(
                T + "resume_mode",
                "from_path needs trainer.resume_path; or set trainer.resume_mode=<the checkpoint directory>",
            )
            return
        layer.emit(T + "resume_mode", path)
        layer.alias(f"{T}resume_mode=from_path + {T}resume_path", f"{T}resume_mode", SKYRL)
    if path is not MISSING:
        layer.take(T + "resume_path")
        if mode != "from_path":
            layer.inert(T + "resume_path", "used only with resume_mode=from_path")


def environment(layer: Layer) -> None:
    """SkyRL-gym's `gsm8k` environment is the single-turn `gsm8k_skyrl` reward (its grading); `gsm8k_multi_turn` is
    the built-in environment of that name, whose turn budget SkyRL's generator sets to generator.max_turns; its
    other environments are not built in."""
    key = "environment.env_class"
    name = layer.value(key)
    if name == "gsm8k":
        layer.take(key)
        layer.emit(key, None)
        layer.emit("data.reward_fn", ["gsm8k_skyrl"])
        layer.alias(f"{key}=gsm8k", "data.reward_fn=gsm8k_skyrl with environment.env_class=null", SKYRL)
        layer.differs(
            key,
            SKYRL,
            "SkyRL-gym's single-turn gsm8k environment is the gsm8k_skyrl reward here, its grading (1 when the "
            "first `#### N` equals the answer as text, else 0), scored without an episode. The answer comes "
            "from data.answer_key, else the row's reward_spec.ground_truth",
        )
    elif name == "gsm8k_multi_turn":
        options = "environment.env_options"
        below = layer.current(options)
        if not layer.names(options) and not (isinstance(below, dict) and "max_turns" in below):
            turns = layer.current(G + "max_turns")
            turns = turns if _int(turns) else 1
            layer.emit(f"{options}.max_turns", turns, at=key)
            layer.alias(f"{key}=gsm8k_multi_turn (turn budget)", f"{options}.max_turns=generator.max_turns", SKYRL)
            layer.later(f"{options}.max_turns", _turns_agree(turns))
        layer.differs(
            key,
            SKYRL,
            "the turn rewards are summed into the episode's reward (SkyRL places each at its turn's last token), "
            "and the retry prompts are written in ChatML (environment.env_options.chat_format=llama3 for Llama 3)",
        )
    elif name in SKYRL_GYM_ENVIRONMENTS:
        layer.take(key)
        layer.refuse(
            key,
            f"is {name!r}, SkyRL-gym's {name} environment, which is not built in here; write it as an "
            "rl.core.environments.Environment subclass and set environment.env_class="
            "package.module:Class (gsm8k_multi_turn is a built-in multi-turn example)",
        )


def _turns_agree(emitted: int):
    """SkyRL's generator gives its environment generator.max_turns as the turn budget; the budget set from it must
    still be generator.max_turns in the built config (a later layer may change either)."""

    def check(cfg) -> str | None:
        turns, given = cfg.generator.max_turns, cfg.environment.env_options.get("max_turns")
        if given != emitted or turns == emitted:
            return None  # set by the user after all, or still equal
        return (f"is {emitted}, set from generator.max_turns as SkyRL's generator sets it, but generator.max_turns "
                f"is {turns} in the built config; set environment.env_options.max_turns={turns}")

    return check


def losses(layer: Layer) -> None:
    """SkyRL's policy losses and reductions that this project does not have, named."""
    for key, missing in (
        (T + "algorithm.policy_loss_type", MISSING_LOSSES),
        (T + "algorithm.loss_reduction", MISSING_REDUCTIONS),
    ):
        value = layer.value(key)
        if isinstance(value, str) and value in missing:
            layer.take(key)
            layer.refuse(
                key,
                f"is {value!r}, {missing[value]}, which is not available here; pick one the key "
                "lists in rl/core/config/schema_algorithm.py",
            )


SKYRL_RECOMPUTE_DEFAULTS = {
    "recompute_granularity": "full",
    "recompute_modules": ["core_attn"],
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
    "gradient_accumulation_fusion": False,
}
"""SkyRL's transformer_config_kwargs defaults: whole layers recomputed when trainer.gradient_checkpointing is true,
as megatron does here."""


def megatron_kwargs(layer: Layer) -> None:
    """SkyRL passes megatron's recompute settings in transformer_config_kwargs: at SkyRL's defaults they ask for what
    trainer.gradient_checkpointing does here; recompute_granularity is a key of our block; Megatron-Core 0.16 calls
    the `ffn` recompute module `mlp`."""
    kwargs = f"{MEGATRON}.transformer_config_kwargs"
    layer.expand(kwargs)
    layer.expand(f"{MEGATRON}.optimizer_config_kwargs")
    for name, default in SKYRL_RECOMPUTE_DEFAULTS.items():
        if layer.value(f"{kwargs}.{name}") == default:
            layer.take(f"{kwargs}.{name}")
            layer.inert(
                f"{kwargs}.{name}",
                "SkyRL's default: whole layers are recomputed when trainer.gradient_checkpointing is true, as here",
            )
    granularity = layer.value(f"{kwargs}.recompute_granularity")
    if granularity is not MISSING:
        layer.take(f"{kwargs}.recompute_granularity")
        layer.emit(f"{MEGATRON}.recompute_granularity", granularity)
        layer.alias(f"{kwargs}.recompute_granularity", f"{MEGATRON}.recompute_granularity", SKYRL)
    modules = layer.value(f"{kwargs}.recompute_modules")
    if isinstance(modules, list) and "ffn" in modules:
        layer.take(f"{kwargs}.recompute_modules")
        layer.emit(f"{kwargs}.recompute_modules", ["mlp" if name == "ffn" else name for name in modules])
        layer.differs(
            f"{kwargs}.recompute_modules",
            SKYRL,
            "`ffn` is Megatron-Core 0.16's `mlp` (the MLP block's activations are recomputed)",
        )


def weight_sync(layer: Layer) -> None:
    """SkyRL's `nccl` with colocated engines sends the weights by CUDA IPC: our null picks that (ipc) on a GPU."""
    for key in (IE + "weight_sync_backend", G + "weight_sync_backend"):
        value = layer.value(key)
        if value is MISSING:
            continue
        colocated = layer.current("trainer.placement.colocate_all") is True
        if value == "nccl" and colocated:
            layer.take(key)
            layer.emit(G + "weight_sync_backend", None)
            layer.alias(f"{key}=nccl", f"{G}weight_sync_backend=null", SKYRL)
            layer.differs(
                key,
                SKYRL,
                "nccl with colocated engines is CUDA IPC in SkyRL; here null picks ipc when "
                "every engine worker is on training rank 0's device, else ray (and the "
                "colocated hf engine takes the weights through Ray)",
            )
        elif key.startswith(IE):
            layer.take(key)
            if value == "delta":
                layer.refuse(
                    key,
                    "is 'delta', checkpoint-delta weight sync through storage: not available here; "
                    "use nccl (engines on devices of their own) or leave it null",
                )
                continue
            layer.emit(G + "weight_sync_backend", value)
            layer.alias(key, G + "weight_sync_backend", SKYRL)


def _equal_later(layer: Layer, key: str, value: Any, ours: str, what: str) -> None:
    """Accept `key` when the built config's `ours` equals `value`."""

    def check(cfg) -> str | None:
        have = get(cfg, ours)
        return None if have == value else f"is {value!r}, but {what}: {ours} is {have!r}; remove it or make them equal"

    layer.later(key, check)
    layer.inert(key, f"equal to {ours} (checked)")


def must_match(layer: Layer) -> None:
    """Keys accepted when they agree with our keys of the same meaning, checked on the built config."""
    pairs = [
        (
            f"{T}ref.megatron_config.{name}",
            f"{MEGATRON}.{name}",
            "the reference model uses the policy's Megatron-Core layout here",
        )
        for name in REF_LAYOUT
    ]
    pairs += [
        (
            f"{T}ref.sequence_parallel_size",
            f"{T}policy.sequence_parallel_size",
            "the reference model runs in the policy's sequence-parallel groups here",
        ),
        (f"{G}model_name", f"{T}policy.model.path", "the engines serve the policy's model"),
        (f"{ESP}max_generate_length", f"{G}max_generate_length", "evaluation uses the training length here"),
        (f"{ESP}stop", f"{G}stop", "evaluation uses the training stop strings here"),
    ]
    for key, ours, what in pairs:
        value = layer.take(key)
        if value is not MISSING:
            _equal_later(layer, key, value, ours, what)
    for key, ours, what in (
        (f"{T}algorithm.temperature", f"{G}temperature", "logprobs are taken at the sampling temperature here"),
        (
            f"{T}algorithm.max_seq_len",
            f"{G}max_generate_length",
            "the seq_mean_token_sum_norm normalizer is generator.max_generate_length here",
        ),
    ):
        value = layer.take(key)
        if value is None:
            layer.inert(key, "null: the value this project uses")
        elif value is not MISSING:
            _equal_later(layer, key, value, ours, what)
    if layer.value(G + "eval_sampling_params", 0) is None:
        layer.take(G + "eval_sampling_params")
        layer.inert(G + "eval_sampling_params", "null: evaluation at generator.eval_temperature")


def expert_tensor_parallel(layer: Layer, key: str = f"{MEGATRON}.expert_tensor_parallel_size") -> None:
    """The expert tensor-parallel size is accepted where it is what this project uses: TP (or no experts split)."""
    value = layer.take(key)
    if value is MISSING:
        return
    if value is None:
        layer.inert(key, "null: the expert tensor-parallel size is the tensor-parallel size, as here")
        return

    def check(cfg) -> str | None:
        tp = get(cfg, f"{MEGATRON}.tensor_model_parallel_size")
        ep = get(cfg, f"{MEGATRON}.expert_model_parallel_size")
        if value == tp or ep == 1:
            return None
        return (
            f"is {value}, but experts are split with the tensor-parallel size here (ETP = TP = {tp}); remove it "
            "or set the tensor-parallel size to it"
        )

    layer.later(key, check)
    layer.inert(key, "the expert tensor-parallel size is the tensor-parallel size here (checked)")


def truncated_importance_sampling(layer: Layer) -> None:
    """SkyRL's deprecated `use_tis` + `tis_imp_ratio_cap`: token-level TIS capped at the ratio cap."""
    use, cap = layer.take(T + "algorithm.use_tis"), layer.take(T + "algorithm.tis_imp_ratio_cap")
    opc = T + "algorithm.off_policy_correction."
    if use is True:
        if not isinstance(cap, int | float) or isinstance(cap, bool) or cap <= 0:
            layer.refuse(
                T + "algorithm.use_tis",
                f"needs trainer.algorithm.tis_imp_ratio_cap > 0, got {cap!r}; or "
                f"set {opc}tis_ratio_type=token with {opc}token_tis_ratio_clip_high",
            )
            return
        layer.emit(opc + "tis_ratio_type", "token", at=T + "algorithm.use_tis")
        layer.emit(opc + "token_tis_ratio_clip_high", cap, at=T + "algorithm.use_tis")
        layer.alias(
            f"{T}algorithm.use_tis + tis_imp_ratio_cap", f"{opc}tis_ratio_type=token + token_tis_ratio_clip_high", SKYRL
        )
        return
    for key, value in ((T + "algorithm.use_tis", use), (T + "algorithm.tis_imp_ratio_cap", cap)):
        if value is not MISSING:
            layer.inert(key, "SkyRL's deprecated TIS switch, off")


def cispo(layer: Layer) -> None:
    """SkyRL's `cispo` block: the upper offset is our eps_clip_high; a lower offset of 1 (weight >= 0) is ours."""
    block = T + "algorithm.cispo."
    high, low, anchor = (
        layer.take(block + name) for name in ("cispo_eps_clip_high", "cispo_eps_clip_low", "cispo_anchor")
    )
    used = layer.current(T + "algorithm.policy_loss_type") == "cispo"
    for name, value in (("cispo_eps_clip_high", high), ("cispo_eps_clip_low", low), ("cispo_anchor", anchor)):
        if value is not MISSING and not used:
            layer.inert(block + name, "used only with policy_loss_type=cispo")
    if not used:
        return
    if high is not MISSING:
        layer.emit(T + "algorithm.eps_clip_high", high, at=block + "cispo_eps_clip_high")
        layer.alias(block + "cispo_eps_clip_high", T + "algorithm.eps_clip_high", SKYRL)
    if low is not MISSING and low != 1.0:
        layer.refuse(
            block + "cispo_eps_clip_low",
            f"is {low}, a lower bound on the CISPO weight: not available here "
            "(the weight is min(r, 1 + eps_clip_high)); set it to 1.0",
        )
    elif low is not MISSING:
        layer.inert(block + "cispo_eps_clip_low", "no lower bound on the CISPO weight, as here")
    if anchor not in (MISSING, "old"):
        layer.refuse(
            block + "cispo_anchor",
            f"is {anchor!r}: a CISPO ratio to the rollout logprobs is not available here; set it to old",
        )
    elif anchor is not MISSING:
        layer.inert(block + "cispo_anchor", "the ratio to the old policy, as here")


def schedulers(layer: Layer) -> None:
    """SkyRL's `scheduler` names transformers' schedules: its `cosine` and `linear` are ours; its
    `constant_with_warmup` is our `constant`, and its `constant` has no warm-up (transformers' get_scheduler
    ignores num_warmup_steps for it), so neither has this run."""
    for model in ("policy", "critic"):
        block = f"{T}{model}.optimizer_config."
        value = layer.value(block + "scheduler")
        if value == "constant_with_warmup":
            layer.take(block + "scheduler")
            layer.emit(block + "scheduler", "constant")
            layer.alias(f"{block}scheduler=constant_with_warmup", f"{block}scheduler=constant", SKYRL)
        elif value == "constant" and layer.value(block + "num_warmup_steps", 0):
            layer.take(block + "num_warmup_steps")
            layer.inert(block + "num_warmup_steps", "SkyRL's scheduler=constant has no warm-up (transformers' "
                        "get_scheduler ignores it); nor has this run")


def sample_full_batch(layer: Layer) -> None:
    """SkyRL's fully-async DAPO filter (`fully_async.sample_full_batch`, which needs its zero_variance_filter): groups
    whose rewards do not vary are dropped and generation goes on until the batch is full, as
    dynamic_sampling.type=filter does with trainer.fully_async here."""
    key = T + "fully_async.sample_full_batch"
    value = layer.take(key)
    if value is MISSING:
        return
    if value is not True:
        layer.inert(key, "off")
        return
    if layer.current(T + "fully_async.enabled") is not True:
        layer.inert(key, "used only with trainer.fully_async.enabled, as in SkyRL")
        return
    layer.emit(T + "algorithm.dynamic_sampling.type", "filter", at=key)
    layer.emit(T + "algorithm.dynamic_sampling.max_sample_batches", -1, at=key)
    layer.alias(key, f"{T}algorithm.dynamic_sampling.type=filter (max_sample_batches=-1)", SKYRL)
    layer.differs(key, SKYRL, "groups are dropped when their rewards are exactly equal and the batch refilled per "
                              "training step (train_batch_size prompts); SkyRL compares within "
                              "zero_variance_filter_tol and refills each mini-batch")


def engine_kwargs(layer: Layer) -> None:
    """SkyRL's 2026 spelling of the extra vLLM arguments (its 2025 one, generator.engine_init_kwargs, is ours)."""
    move_mapping(layer, f"{IE}engine_init_kwargs", f"{G}engine_init_kwargs", SKYRL, LIFTED_ENGINE_ARGUMENTS)


RULES = (
    sample_full_batch,
    schedulers,
    engine_kwargs,
    megatron_kwargs,
    intervals,
    resume,
    environment,
    losses,
    weight_sync,
    must_match,
    expert_tensor_parallel,
    truncated_importance_sampling,
    cispo,
)
