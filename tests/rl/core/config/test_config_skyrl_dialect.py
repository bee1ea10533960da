"""SkyRL's configs as its users write them (its example scripts, its typed config's defaults): each key read as
ours where the meaning is the same, the differences printed, keys with no effect listed, missing features refused
by name, SkyRL's own spellings of values on keys we share."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import load_config
from tests.rl.core.config.dialect_loading import config_lines, load_logged, refusals
from tests.rl.core.config.skyrl_scripts import SKYRL_SCRIPTS, skyrl_args
from tests.rl.core.config.upstream_configs import SKYRL_DEFAULTS


# --- SkyRL's scripts ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SKYRL_SCRIPTS))
def test_skyrl_script_loads_or_refuses_only_missing_features(name, caplog):
    script = SKYRL_SCRIPTS[name]
    if script.refused:
        refused = refusals(skyrl_args(name))
        assert set(refused) == set(script.refused), refused
        return
    cfg = load_logged(caplog, skyrl_args(name))
    if name == "fully_async":  # GLM-5's loss on rollout logprobs, the geometric sequence mask, staleness 4
        assert (cfg.trainer.algorithm.policy_loss_type, cfg.trainer.resume_mode) == ("rollout_is", "latest")
        assert (cfg.trainer.fully_async.enabled, cfg.trainer.fully_async.max_staleness_steps) == (True, 4)
        correction = cfg.trainer.algorithm.off_policy_correction
        assert (correction.sequence_mask_metric, correction.geo_mask_low, correction.geo_mask_high) == (
            "geometric", 0.99, 1.01)
        assert cfg.generator.weight_sync_backend == "nccl"  # engines on GPUs of their own (colocate_all=false)
        return
    assert cfg.trainer.resume_mode == "none"  # resume_mode=null
    assert cfg.generator.max_prompt_length == 512 and cfg.generator.max_generate_length == 1024
    assert cfg.generator.weight_sync_backend is None  # nccl with colocated engines: CUDA IPC in SkyRL
    if name == "multi_turn":  # the built-in gsm8k_multi_turn, its turn budget SkyRL's generator.max_turns
        assert cfg.environment.env_class == "gsm8k_multi_turn"
        assert cfg.environment.env_options == {"max_turns": cfg.generator.max_turns} == {"max_turns": 1}
        return
    assert (cfg.environment.env_class, cfg.data.reward_fn) == (None, ["gsm8k_skyrl"])


def test_skyrl_quickstart_meanings_and_printed_lines(caplog):
    cfg = load_logged(caplog, skyrl_args("gsm8k"))
    assert (cfg.trainer.strategy, cfg.generator.num_inference_engines, cfg.generator.backend) == ("fsdp", 4, "vllm")
    assert cfg.generator.inference_engine_tensor_parallel_size == 1
    assert cfg.generator.gpu_memory_utilization == 0.8
    assert cfg.trainer.logger == ["wandb"] and cfg.trainer.ckpt_path.endswith("/ckpts/gsm8k_1.5B_ckpt")
    lines = config_lines(caplog)
    aliases = next(line for line in lines if "keys read as ours" in line)
    for pair in (
        "generator.inference_engine.num_engines -> generator.num_inference_engines",
        "generator.sampling_params.max_generate_length -> generator.max_generate_length",
        "trainer.max_prompt_length -> generator.max_prompt_length",
    ):
        assert pair in aliases
    inert = next(line for line in lines if "accepted with no effect here" in line)
    for key in ("trainer.eval_batch_size", "generator.batched", "trainer.log_path"):
        assert key in inert
    differs = [line for line in lines if "(SkyRL):" in line]
    assert {line.split(" (SkyRL)")[0].removeprefix("config: ") for line in differs} == {
        "environment.env_class",
        "generator.inference_engine.weight_sync_backend",
        "trainer.max_prompt_length",
    }


def test_skyrl_megatron_example_layout(caplog):
    cfg = load_logged(caplog, skyrl_args("megatron"))
    block = cfg.blocks["trainer.policy.megatron_config"]
    assert (block.tensor_model_parallel_size, block.pipeline_model_parallel_size) == (2, 2)
    assert cfg.trainer.use_sample_packing is True


def test_skyrl_reference_layout_must_be_the_policys():
    refused = refusals([*skyrl_args("megatron"), "trainer.ref.megatron_config.tensor_model_parallel_size=1"])
    assert "uses the policy's Megatron-Core layout" in refused["trainer.ref.megatron_config.tensor_model_parallel_size"]


def test_skyrl_lora_example(caplog):
    lora = load_logged(caplog, skyrl_args("lora")).trainer.policy.model.lora
    assert (lora.rank, lora.alpha, lora.target_modules) == (32, 32.0, ["all-linear"])


def test_skyrl_missing_features_are_named():
    refused = refusals(["trainer.algorithm.policy_loss_type=dppo"])
    assert "DPPO's divergence-masked loss" in refused["trainer.algorithm.policy_loss_type"]
    refused = refusals(["environment.env_class=text2sql"])
    assert "SkyRL-gym's text2sql environment, which is not built in" in refused["environment.env_class"]


def test_skyrl_multi_turn_turn_budget_follows_generator_max_turns(caplog, tmp_path):
    cfg = load_logged(caplog, [*skyrl_args("multi_turn"), "generator.max_turns=3"])
    assert (cfg.environment.env_class, cfg.environment.env_options) == ("gsm8k_multi_turn", {"max_turns": 3})
    given = load_logged(caplog, [*skyrl_args("multi_turn"), "environment.env_options.max_turns=2",
                                 "generator.max_turns=3"])
    assert given.environment.env_options == {"max_turns": 2}  # the user's own budget stays
    # The environment from the file, generator.max_turns from the command line (over the file's own): the budget
    # follows the override, as it would were both on the command line
    config = tmp_path / "run.yaml"
    config.write_text("environment: {env_class: gsm8k_multi_turn}\ngenerator: {max_turns: 2}\n", encoding="utf-8")
    overridden = load_logged(caplog, ["generator.max_turns=4"], config_file=str(config))
    assert (overridden.generator.max_turns, overridden.environment.env_options) == (4, {"max_turns": 4})


def test_every_skyrl_key_that_is_not_ours_loads_at_skyrls_default(caplog):
    """Each key is one of ours (SkyRL's spelling kept), or printed as read as ours or as accepted with no effect
    (none dropped unsaid); and the config is our defaults but for the keys read as ours, which hold SkyRL's
    defaults in our spelling."""
    overrides = [
        f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
        for key, value in SKYRL_DEFAULTS.items()
    ]
    cfg = load_logged(caplog, overrides)
    named, ours = _printed_keys(config_lines(caplog)), _flat_config(load_config([]))

    def said(key, value) -> bool:  # a mapping sets each of its keys (an empty one none)
        return key in named or key in ours or (
            isinstance(value, dict) and all(said(f"{key}.{name}", inner) for name, inner in value.items()))

    unsaid = [key for key, value in SKYRL_DEFAULTS.items() if not said(key, value)]
    assert not unsaid, f"loaded without a word: {unsaid}"
    skyrl, policy, critic = SKYRL_DEFAULTS, "trainer.policy.optimizer_config.", "trainer.critic.optimizer_config."
    engine, sampling = "generator.inference_engine.", "generator.sampling_params."
    same_meaning = {  # our key: SkyRL's key, whose default it takes as it is
        policy + "betas": policy + "adam_betas",
        critic + "betas": critic + "adam_betas",
        policy + "lr_warmup_steps": policy + "num_warmup_steps",
        critic + "lr_warmup_steps": critic + "num_warmup_steps",
        "trainer.max_steps": "trainer.max_training_steps",
        "trainer.use_sample_packing": "trainer.remove_microbatch_padding",
        "generator.max_prompt_length": "trainer.max_prompt_length",
        "generator.num_inference_engines": engine + "num_engines",
        "generator.backend": engine + "backend",
        "generator.inference_engine_tensor_parallel_size": engine + "tensor_parallel_size",
        "generator.enable_prefix_caching": engine + "enable_prefix_caching",
        "generator.max_num_batched_tokens": engine + "max_num_batched_tokens",
        "generator.gpu_memory_utilization": engine + "gpu_memory_utilization",
        "generator.max_num_seqs": engine + "max_num_seqs",
        "generator.max_generate_length": sampling + "max_generate_length",
        "generator.temperature": sampling + "temperature",
        "generator.top_p": sampling + "top_p",
        "generator.top_k": sampling + "top_k",
        "generator.stop": sampling + "stop",
        "generator.eval_temperature": "generator.eval_sampling_params.temperature",
        "environment.max_env_workers": "environment.skyrl_gym.max_env_workers",
    }
    translated = {
        policy + "scheduler": "constant",  # constant_with_warmup
        critic + "scheduler": "constant",
        "generator.weight_sync_backend": None,  # nccl beside colocated engines: picked by the placement here
        "generator.weight_sync_bucket_mb": 1024 * skyrl[engine + "weight_transfer_threshold_cuda_ipc_GB"],  # GiB
        "trainer.max_tokens_per_micro_batch": None,  # -1: no limit
        "trainer.policy.megatron_config.optimizer_cpu_offload":
            skyrl["trainer.policy.megatron_config.optimizer_config_kwargs"]["optimizer_cpu_offload"],
    }
    want = {**ours, **{key: skyrl[theirs] for key, theirs in same_meaning.items()}, **translated}
    loaded = _flat_config(cfg)
    assert loaded.keys() == ours.keys()
    mismatched = {key: (value, want[key]) for key, value in loaded.items() if value != want[key]}
    assert not mismatched, f"(loaded, SkyRL's default): {mismatched}"


def _printed_keys(lines: list[str]) -> set[str]:
    """The keys the loader's lines name as read as ours (`theirs[=value] -> ours`) or as accepted with no effect
    (`key, key (why); key (why)`, the reasons in parentheses)."""
    keys: set[str] = set()
    for line in lines:
        if " keys read as ours: " in line:
            pairs = line.split(" keys read as ours: ", 1)[1].split(", ")
            keys.update(pair.split(" -> ")[0].split("=")[0] for pair in pairs if " -> " in pair)
        elif " keys accepted with no effect here: " in line:
            listed, depth = "", 0
            for char in line.split(" keys accepted with no effect here: ", 1)[1]:
                depth += (char == "(") - (char == ")")
                listed += char if depth == 0 and char != ")" else ""
            keys.update(key.strip() for key in listed.replace(";", ",").split(",") if key.strip())
    return keys


def _flat_config(cfg) -> dict:
    """Every leaf of a loaded config by its dotted key (a strategy's block under its own key)."""
    tree = dataclasses.asdict(cfg)
    flat = _flat({name: value for name, value in tree.items() if name != "blocks"})
    for key, block in tree["blocks"].items():
        flat.update(_flat(block, key + "."))
    return flat


def _flat(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for name, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{name}."))
        else:
            flat[prefix + name] = value
    return flat


def test_skyrl_value_spellings(tmp_path, caplog):
    checkpoint = tmp_path / "global_step_3"
    checkpoint.mkdir()
    cfg = load_logged(
        caplog,
        [
            "trainer.eval_interval=-1",
            "trainer.hf_save_interval=-1",
            "trainer.ckpt_interval=-1",
            "trainer.resume_mode=from_path",
            f"trainer.resume_path={checkpoint}",
            "trainer.max_ckpts_to_keep=-1",
            "trainer.max_training_steps=7",
            "trainer.policy.optimizer_config.adam_betas=[0.9, 0.95]",
            "trainer.policy.optimizer_config.num_warmup_steps=5",
            "trainer.max_tokens_per_microbatch=-1",
            "trainer.remove_microbatch_padding=false",
        ],
    )
    assert (cfg.trainer.eval_interval, cfg.trainer.hf_save_interval, cfg.trainer.ckpt_interval) == (0, 0, 0)
    assert cfg.trainer.resume_mode == str(checkpoint) and cfg.trainer.max_steps == 7
    assert cfg.trainer.policy.optimizer_config.betas == [0.9, 0.95]
    assert cfg.trainer.policy.optimizer_config.lr_warmup_steps == 5
    assert cfg.trainer.max_tokens_per_micro_batch is None and cfg.trainer.use_sample_packing is False


def test_checkpoint_retention_keys(caplog):
    """SkyRL's `max_ckpts_to_keep` is ours; NeMo RL's keep_top_k / metric_name / higher_is_better map onto it."""
    assert load_logged(caplog, ["trainer.max_ckpts_to_keep=3"]).trainer.max_ckpts_to_keep == 3
    refused = refusals(["trainer.max_ckpts_to_keep=0"])
    assert "-1 (keep every checkpoint) or an integer >= 1" in refused["trainer.max_ckpts_to_keep"]
    refused = refusals(["trainer.ckpt_keep_metric=val_accuracy"])
    assert "keeps every checkpoint (-1)" in refused["trainer.ckpt_keep_metric"]


def test_skyrl_deprecated_tis_and_cispo_offsets(caplog):
    cfg = load_logged(
        caplog,
        [
            "trainer.algorithm.use_tis=true",
            "trainer.algorithm.tis_imp_ratio_cap=2.5",
            "trainer.algorithm.policy_loss_type=cispo",
            "trainer.algorithm.cispo.cispo_eps_clip_high=4.0",
            "trainer.algorithm.cispo.cispo_eps_clip_low=1.0",
        ],
    )
    correction = cfg.trainer.algorithm.off_policy_correction
    assert (correction.tis_ratio_type, correction.token_tis_ratio_clip_high) == ("token", 2.5)
    assert cfg.trainer.algorithm.eps_clip_high == 4.0
    refused = refusals(["trainer.algorithm.policy_loss_type=cispo", "trainer.algorithm.cispo.cispo_eps_clip_low=0.5"])
    assert "lower bound on the CISPO weight" in refused["trainer.algorithm.cispo.cispo_eps_clip_low"]


def test_engine_arguments_reach_vllm_unless_a_key_sets_them():
    """SkyRL's engine_init_kwargs (2025 and 2026 spellings) and NeMo RL's vllm_kwargs are the arguments every vLLM
    engine gets here too, except those a key of ours or the trainer sets."""
    vllm = "generator.backend=vllm"
    for given in ("generator.inference_engine.engine_init_kwargs={enforce_eager: false, kv_cache_dtype: fp8}",
                  "generator.engine_init_kwargs={enforce_eager: false, kv_cache_dtype: fp8}",
                  "policy.generation.vllm_kwargs={enforce_eager: false, kv_cache_dtype: fp8}"):
        cfg = load_config([vllm, given])
        assert cfg.generator.engine_init_kwargs == {"enforce_eager": False, "kv_cache_dtype": "fp8"}, given
    cfg = load_config([vllm, "generator.inference_engine.engine_init_kwargs.swap_space=2"])
    assert cfg.generator.engine_init_kwargs == {"swap_space": 2}
    key = "generator.engine_init_kwargs"
    refused = refusals([vllm, "generator.inference_engine.engine_init_kwargs={enable_sleep_mode: true, seed: 1}"])
    assert "is set by the trainer: sleep follows the placement" in refused[f"{key}.enable_sleep_mode"]
    assert refused[f"{key}.seed"].endswith("is set by trainer.seed: give that instead")


def test_learning_rate_schedules(caplog):
    """SkyRL's `scheduler` names transformers' schedules: constant_with_warmup is our constant, its cosine and
    linear are ours; its constant has no warm-up (transformers ignores num_warmup_steps there)."""
    block = "trainer.policy.optimizer_config."
    cfg = load_logged(caplog, [f"{block}scheduler=constant_with_warmup", f"{block}num_warmup_steps=5"])
    assert (cfg.trainer.policy.optimizer_config.scheduler, cfg.trainer.policy.optimizer_config.lr_warmup_steps) == (
        "constant", 5)
    cfg = load_logged(caplog, [f"{block}scheduler=constant", f"{block}num_warmup_steps=5"])
    assert cfg.trainer.policy.optimizer_config.lr_warmup_steps == 0
    assert "SkyRL's scheduler=constant has no warm-up" in "\n".join(config_lines(caplog))
    critic = load_config(["trainer.critic.optimizer_config.scheduler=linear"]).trainer.critic.optimizer_config
    assert (critic.scheduler, critic.min_lr, critic.lr_decay_steps) == ("linear", 0.0, None)
    refused = refusals([f"{block}scheduler=cosine_with_restarts"])
    assert "use any of: constant, cosine, linear" in refused[f"{block}scheduler"]


def test_zero_variance_filter_and_sample_full_batch(caplog):
    """SkyRL's zero_variance_filter is ours; its fully-async sample_full_batch (dropping such groups and refilling
    the batch) is dynamic_sampling.type=filter with no bound on batches, printed with its differences, and has no
    effect without fully_async, as in SkyRL."""
    asynchronous = ["trainer.fully_async.enabled=true", "trainer.placement.colocate_all=false"]
    cfg = load_logged(caplog, [*asynchronous, "trainer.algorithm.zero_variance_filter=true",
                               "trainer.fully_async.sample_full_batch=true"])
    sampling = cfg.trainer.algorithm.dynamic_sampling
    assert (sampling.type, sampling.max_sample_batches, cfg.trainer.algorithm.zero_variance_filter) == (
        "filter", -1, True)
    assert any("refilled per training step" in line for line in config_lines(caplog))
    cfg = load_logged(caplog, ["trainer.fully_async.sample_full_batch=true"])
    assert cfg.trainer.algorithm.dynamic_sampling.type is None
    assert "used only with trainer.fully_async.enabled" in "\n".join(config_lines(caplog))


def test_skyrl_keys_of_features_that_exist_here_are_read(caplog):
    """Keys once refused as "a later issue": the endpoint's served name is ours, the vision-language generator
    switch follows the model, and `language_model_only` (a VLM loaded without its vision tower) says what to do."""
    cfg = load_logged(caplog, ["generator.inference_engine.served_model_name=policy",
                               "generator.vision_language_generator=true"])
    assert cfg.generator.served_model_name == "policy"
    assert any("generator.vision_language_generator" in line and "accepted with no effect" in line
               for line in config_lines(caplog))
    refused = refusals(["trainer.policy.language_model_only=true"])["trainer.policy.language_model_only"]
    assert "vision tower" in refused and "freeze_vision_tower" in refused
    assert load_config(["trainer.policy.language_model_only=false"]).trainer.policy.model.freeze_vision_tower is False


def test_a_key_skyrl_removed_is_refused_naming_skyrls_change():
    refused = refusals(["generator.inference_engine.async_engine=true"])["generator.inference_engine.async_engine"]
    assert refused == ("generator.inference_engine.async_engine: SkyRL removed this key (in July 2026: its engines "
                       "are always asynchronous); drop it")


def test_no_dialect_entry_promises_a_later_feature():
    """A refusal says what to do now: a feature that lands replaces its refusal (an alias, or an accepted key), so
    no entry may leave a user waiting for "a later issue"."""
    from rl.core.config.dialects import DIALECTS

    promise = re.compile(r"\b(a later|later issues?|not yet|coming soon|planned|in (a|the) future)\b", re.I)
    for dialect in DIALECTS:
        for key, entry in dialect.table().items():
            texts = [value for value in dataclasses.asdict(entry).values() if isinstance(value, str)]
            assert not any(promise.search(text) for text in texts), (dialect.name, key, texts)


def test_no_dialect_entry_names_a_key_of_ours():
    """A key of ours is read as ours before any table is looked at: an entry under the same name (a peer's spelling
    that became ours when its feature landed here) would never apply, and what it says would be stale. (A `ByRule`
    entry only names a key a dialect rule reads, which rules do before the tables.)"""
    from rl.core.config.dialects import DIALECTS
    from rl.core.config.dialects.entries import ByRule
    from rl.core.config.keys import known

    shadowed = [(dialect.name, key) for dialect in DIALECTS for key, entry in dialect.table().items()
                if "*" not in key and known(key) and not isinstance(entry, ByRule)]
    assert shadowed == []
