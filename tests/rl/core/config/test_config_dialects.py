"""SkyRL's and NeMo RL's configs as their users write them: each key read as ours where the meaning is the same,
the differences printed, keys with no effect listed, missing features refused by name; NeMo RL's `defaults:`
inheritance and `${...}` interpolation; the seeds' keys; suggestions by meaning."""

from __future__ import annotations

import logging
import os
import textwrap

import pytest
import yaml

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import ConfigError, config_to_dict, load_config, save_config
from rl.core.config.keys import all_keys
from tests.rl.core.config.skyrl_scripts import SKYRL_SCRIPTS, skyrl_args
from tests.rl.core.config.upstream_configs import NEMO_1B, NEMO_1B_MEGATRON, SEED_KEYS, SKYRL_DEFAULTS


def _load(caplog, overrides=(), config_file=None):
    with caplog.at_level(logging.INFO, logger="rl.core.config"):
        return load_config(list(overrides), config_file=config_file)


def _refused(overrides=(), config_file=None) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config(list(overrides), config_file=config_file)
    return {line.split(":", 1)[0]: line for line in info.value.problems}


def _lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.getMessage().startswith("config: ")]


# --- SkyRL's scripts ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SKYRL_SCRIPTS))
def test_skyrl_script_loads_or_refuses_only_missing_features(name, caplog):
    script = SKYRL_SCRIPTS[name]
    if script.refused:
        refused = _refused(skyrl_args(name))
        assert set(refused) == set(script.refused), refused
        return
    cfg = _load(caplog, skyrl_args(name))
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
    cfg = _load(caplog, skyrl_args("gsm8k"))
    assert (cfg.trainer.strategy, cfg.generator.num_inference_engines, cfg.generator.backend) == ("fsdp", 4, "vllm")
    assert cfg.generator.inference_engine_tensor_parallel_size == 1
    assert cfg.generator.gpu_memory_utilization == 0.8
    assert cfg.trainer.logger == ["wandb"] and cfg.trainer.ckpt_path.endswith("/ckpts/gsm8k_1.5B_ckpt")
    lines = _lines(caplog)
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
    cfg = _load(caplog, skyrl_args("megatron"))
    block = cfg.blocks["trainer.policy.megatron_config"]
    assert (block.tensor_model_parallel_size, block.pipeline_model_parallel_size) == (2, 2)
    assert cfg.trainer.use_sample_packing is True


def test_skyrl_reference_layout_must_be_the_policys():
    refused = _refused([*skyrl_args("megatron"), "trainer.ref.megatron_config.tensor_model_parallel_size=1"])
    assert "uses the policy's Megatron-Core layout" in refused["trainer.ref.megatron_config.tensor_model_parallel_size"]


def test_skyrl_lora_example(caplog):
    lora = _load(caplog, skyrl_args("lora")).trainer.policy.model.lora
    assert (lora.rank, lora.alpha, lora.target_modules) == (32, 32.0, ["all-linear"])


def test_skyrl_missing_features_are_named():
    refused = _refused(["trainer.algorithm.policy_loss_type=dppo"])
    assert "DPPO's divergence-masked loss" in refused["trainer.algorithm.policy_loss_type"]
    refused = _refused(["environment.env_class=text2sql"])
    assert "SkyRL-gym's text2sql environment, which is not built in" in refused["environment.env_class"]


def test_skyrl_multi_turn_turn_budget_follows_generator_max_turns(caplog, tmp_path):
    cfg = _load(caplog, [*skyrl_args("multi_turn"), "generator.max_turns=3"])
    assert (cfg.environment.env_class, cfg.environment.env_options) == ("gsm8k_multi_turn", {"max_turns": 3})
    given = _load(caplog, [*skyrl_args("multi_turn"), "environment.env_options.max_turns=2", "generator.max_turns=3"])
    assert given.environment.env_options == {"max_turns": 2}  # the user's own budget stays
    # Set from the file's generator.max_turns, then changed by an override: named, with the fix.
    config = tmp_path / "run.yaml"
    config.write_text("environment: {env_class: gsm8k_multi_turn}\n", encoding="utf-8")
    refused = _refused(["generator.max_turns=4"], config_file=str(config))
    assert "set environment.env_options.max_turns=4" in refused["environment.env_options.max_turns"]


def test_every_skyrl_key_that_is_not_ours_loads_at_skyrls_default(caplog):
    overrides = [
        f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
        for key, value in SKYRL_DEFAULTS.items()
    ]
    _load(caplog, overrides)


def test_skyrl_value_spellings(tmp_path, caplog):
    checkpoint = tmp_path / "global_step_3"
    checkpoint.mkdir()
    cfg = _load(
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
    assert _load(caplog, ["trainer.max_ckpts_to_keep=3"]).trainer.max_ckpts_to_keep == 3
    refused = _refused(["trainer.max_ckpts_to_keep=0"])
    assert "-1 (keep every checkpoint) or an integer >= 1" in refused["trainer.max_ckpts_to_keep"]
    refused = _refused(["trainer.ckpt_keep_metric=val_accuracy"])
    assert "keeps every checkpoint (-1)" in refused["trainer.ckpt_keep_metric"]


def test_skyrl_deprecated_tis_and_cispo_offsets(caplog):
    cfg = _load(
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
    refused = _refused(["trainer.algorithm.policy_loss_type=cispo", "trainer.algorithm.cispo.cispo_eps_clip_low=0.5"])
    assert "lower bound on the CISPO weight" in refused["trainer.algorithm.cispo.cispo_eps_clip_low"]


def test_engine_arguments_are_refused_not_dropped():
    key = "generator.inference_engine.engine_init_kwargs"
    assert "extra vLLM engine arguments" in _refused([f"{key}={{enable_sleep_mode: true}}"])[key]
    assert "extra vLLM engine arguments" in _refused([f"{key}.enable_sleep_mode=true"])[key + ".enable_sleep_mode"]


# --- NeMo RL's files ----------------------------------------------------------------------------------------------
def _pointed(tmp_path, parent: str, extra: str = "") -> str:
    """A NeMo RL child file over `parent` with the data and the prompt template pointed at local files, as a NeMo RL
    user would write it."""
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    for path in (train, val):
        path.write_text('{"prompt": "1+1?", "answer": "2"}\n', encoding="utf-8")
    (tmp_path / "cot.txt").write_text("Think, then answer:\n{}", encoding="utf-8")
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        defaults: {parent}
        data:
          train: {{data_path: {train}}}
          validation: {{data_path: {val}}}
          default: {{prompt_file: {tmp_path / "cot.txt"}}}
        """)
        + textwrap.dedent(extra),
        encoding="utf-8",
    )
    return str(path)


def test_nemo_1b_as_written_refuses_only_missing_features():
    refused = _refused(config_file=NEMO_1B)
    assert set(refused) == {
        "data.train.dataset_name",
        "data.train.split_validation_size",
        "data.prompt_template_file",  # data.default.prompt_file, NeMo RL's examples/prompts/cot.txt: not here
    }, refused
    assert "downloads by name" in refused["data.train.dataset_name"]
    assert refused["data.prompt_template_file"].startswith(
        f"data.prompt_template_file: examples/prompts/cot.txt (read as {os.getcwd()}/examples/prompts/cot.txt) does "
        "not exist; "
    )


def test_nemo_1b_meanings(tmp_path, caplog):
    cfg = _load(caplog, config_file=_pointed(tmp_path, NEMO_1B, "grpo:\n  max_num_steps: 20\n"))
    trainer, algorithm = cfg.trainer, cfg.trainer.algorithm
    assert trainer.strategy == "fsdp2"
    assert (trainer.train_batch_size, cfg.generator.n_samples_per_prompt, trainer.policy_mini_batch_size) == (
        32,
        16,
        32,
    )
    assert (trainer.micro_train_batch_size_per_gpu, trainer.micro_forward_batch_size_per_gpu) == (4, 4)
    assert (trainer.max_steps, trainer.eval_interval, trainer.eval_before_train) == (20, 10, False)
    assert (trainer.ckpt_interval, trainer.ckpt_path) == (10, "results/grpo")
    # keep_top_k 3 by val:accuracy, higher is better
    assert (trainer.max_ckpts_to_keep, trainer.ckpt_keep_metric, trainer.ckpt_keep_higher_is_better) == (
        3, "val_accuracy", True)
    optimizer = trainer.policy.optimizer_config
    assert (optimizer.lr, optimizer.weight_decay, optimizer.betas, optimizer.lr_warmup_steps) == (
        5e-6,
        0.01,
        [0.9, 0.999],
        50,
    )
    assert (algorithm.advantage_estimator, algorithm.grpo_norm_by_std, algorithm.loss_reduction) == (
        "grpo",
        True,
        "token_mean",
    )
    assert (algorithm.use_kl_loss, algorithm.kl_loss_coef, algorithm.kl_estimator_type) == (True, 0.01, "k3")
    assert (algorithm.eps_clip_low, algorithm.eps_clip_high, algorithm.policy_loss_type) == (0.2, 0.2, "regular")
    assert trainer.bf16 is True and trainer.gradient_checkpointing is False
    assert trainer.use_sample_packing is True and trainer.max_tokens_per_micro_batch == 512 * 4  # ${mul:...}
    generator = cfg.generator
    assert generator.max_prompt_length + generator.max_generate_length == 512
    assert (generator.backend, generator.top_k, generator.eval_temperature, generator.gpu_memory_utilization) == (
        "vllm",
        -1,
        1.0,
        0.6,
    )
    assert trainer.placement.colocate_all is True
    assert cfg.data.train_data == [str(tmp_path / "train.jsonl")] and cfg.data.val_data == [str(tmp_path / "val.jsonl")]
    assert (cfg.data.reward_fn, cfg.data.reward_num_workers) == (["gsm8k_flexible"], 8)
    assert (cfg.data.prompt_template_file, cfg.data.system_prompt_file) == (str(tmp_path / "cot.txt"), None)
    lines = _lines(caplog)
    assert f"data.default.prompt_file -> data.prompt_template_file='{tmp_path / 'cot.txt'}'" in lines[0]
    assert any(line.startswith("config: grpo.use_leave_one_out_baseline (NeMo RL): ") for line in lines)
    assert any(line.startswith("config: policy.scheduler (NeMo RL): ") for line in lines)


def test_nemo_prompt_files_per_dataset(tmp_path, caplog):
    """A dataset's own prompt_file (even null) over data.default's, as NeMo RL's update_single_dataset_config fills
    them; one pair serves every prompt here, so training and validation files that differ are refused."""
    cot, other, system = (tmp_path / name for name in ("cot.txt", "other.txt", "system.txt"))
    for path, text in ((cot, "Q: {}"), (other, "Other: {}"), (system, "Be brief.")):
        path.write_text(text, encoding="utf-8")
    data = [f"data.train.data_path={tmp_path}/t.jsonl", f"data.validation.data_path={tmp_path}/v.jsonl"]
    cfg = _load(caplog, [*data, f"data.default.prompt_file={other}", f"data.train.prompt_file={cot}",
                         f"data.validation.prompt_file={cot}", f"data.default.system_prompt_file={system}"])
    assert (cfg.data.prompt_template_file, cfg.data.system_prompt_file) == (str(cot), str(system))
    inert = next(line for line in _lines(caplog) if "accepted with no effect here" in line)
    assert "data.default.prompt_file (prompt_file of data.train / data.validation is used)" in inert
    cfg = load_config([f"data.prompt_file={cot}", "data.system_prompt_file=null"])  # NeMo RL's older layout
    assert (cfg.data.prompt_template_file, cfg.data.system_prompt_file) == (str(cot), None)
    refused = _refused([*data, f"data.default.prompt_file={cot}", "data.validation.prompt_file=null"])
    assert refused["data.validation.prompt_file"] == (
        f"data.validation.prompt_file: gives the validation data None and the training data '{cot}'; one file "
        "serves every prompt here (data.prompt_template_file): give both the same"
    )


def test_nemo_1b_megatron_inherits_and_ignores_the_disabled_dtensor_block(tmp_path, caplog):
    cfg = _load(caplog, config_file=_pointed(tmp_path, NEMO_1B_MEGATRON))
    trainer = cfg.trainer
    assert trainer.strategy == "megatron"
    optimizer = trainer.policy.optimizer_config
    assert (optimizer.lr, optimizer.betas, optimizer.max_grad_norm, optimizer.lr_warmup_steps) == (
        5e-6,
        [0.9, 0.999],
        1.0,
        13,
    )
    assert trainer.ckpt_interval == 0  # checkpointing.enabled: false
    assert trainer.gradient_checkpointing is False
    assert cfg.blocks["trainer.policy.megatron_config"].recompute_granularity is None  # activation_checkpointing off
    inert = next(line for line in _lines(caplog) if "accepted with no effect here" in line)
    assert "policy.dtensor_cfg.activation_checkpointing" in inert and "switched off" in inert


def test_disabled_dtensor_block_does_not_turn_megatron_recompute_on():
    cfg = load_config(
        [
            "policy.megatron_cfg.enabled=true",
            "policy.dtensor_cfg.enabled=false",
            "policy.dtensor_cfg.activation_checkpointing=true",
        ]
    )
    assert cfg.trainer.strategy == "megatron" and cfg.trainer.gradient_checkpointing is False


def test_defaults_inheritance_relative_to_the_file(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "grand.yaml").write_text("grpo:\n  num_prompts_per_step: 16\n  max_num_steps: 3\n")
    (tmp_path / "base" / "parent.yaml").write_text(
        "defaults: grand.yaml\ngrpo:\n  max_num_steps: 5\n"
        "policy:\n  optimizer:\n    kwargs: {lr: 1.0e-5, eps: 1.0e-8}\n"
    )
    (tmp_path / "other.yaml").write_text("loss_fn:\n  reference_policy_kl_penalty: 0.0\n")
    child = tmp_path / "child.yaml"
    child.write_text(
        "defaults: [base/parent.yaml, other.yaml]\ngrpo:\n  num_generations_per_prompt: 2\n"
        "policy:\n  optimizer:\n    kwargs: {lr: 2.0e-5}\n"
    )
    cfg = load_config([], config_file=str(child))
    assert (cfg.trainer.train_batch_size, cfg.trainer.max_steps, cfg.generator.n_samples_per_prompt) == (16, 5, 2)
    assert cfg.trainer.policy.optimizer_config.lr == 2e-5  # the child wins, the parent's eps stays
    assert cfg.trainer.algorithm.use_kl_loss is False


def test_defaults_override_mark_replaces_the_inherited_block(tmp_path):
    (tmp_path / "parent.yaml").write_text("policy:\n  optimizer:\n    name: torch.optim.SGD\n    kwargs: {lr: 0.1}\n")
    child = tmp_path / "child.yaml"
    child.write_text(
        "defaults: parent.yaml\npolicy:\n  optimizer:\n    _override_: true\n"
        "    name: torch.optim.AdamW\n    kwargs: {lr: 3.0e-6}\n"
    )
    assert load_config([], config_file=str(child)).trainer.policy.optimizer_config.lr == 3e-6


def test_defaults_loops_and_hydra_groups_are_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("defaults: b.yaml\n")
    (tmp_path / "b.yaml").write_text("defaults: a.yaml\n")
    with pytest.raises(ConfigError, match="inherits itself"):
        load_config([], config_file=str(tmp_path / "a.yaml"))
    (tmp_path / "hydra.yaml").write_text("defaults:\n  - _self_\n  - megatron_config@trainer.policy: policy\n")
    with pytest.raises(ConfigError, match="Hydra config groups are not read"):
        load_config([], config_file=str(tmp_path / "hydra.yaml"))


def test_interpolation_sees_the_childs_values(tmp_path):
    (tmp_path / "parent.yaml").write_text(
        textwrap.dedent("""\
        policy:
          max_total_sequence_length: 256
          train_micro_batch_size: 2
          logprob_batch_size: ${policy.train_micro_batch_size}
          sequence_packing:
            enabled: true
            train_mb_tokens: ${mul:${policy.max_total_sequence_length}, ${policy.train_micro_batch_size}}
        """)
    )
    child = tmp_path / "child.yaml"
    child.write_text("defaults: parent.yaml\npolicy:\n  train_micro_batch_size: 4\n")
    cfg = load_config([], config_file=str(child))
    assert (cfg.trainer.micro_forward_batch_size_per_gpu, cfg.trainer.max_tokens_per_micro_batch) == (4, 1024)


def test_unresolvable_interpolation_names_the_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("policy:\n  logprob_batch_size: ${policy.nothing}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: an interpolation at policy.logprob_batch_size"):
        load_config([], config_file=str(path))


def test_nemo_algorithm_switches():
    cfg = load_config(
        [
            "grpo.use_leave_one_out_baseline=true",
            "grpo.normalize_rewards=false",
            "loss_fn.ratio_clip_c=3.0",
            "loss_fn.token_level_loss=false",
            "grpo.use_dynamic_sampling=true",
            "loss_fn.use_importance_sampling_correction=true",
            "loss_fn.truncated_importance_sampling_type=icepop",
            "loss_fn.truncated_importance_sampling_ratio=5.0",
            "loss_fn.truncated_importance_sampling_ratio_min=0.5",
        ]
    )
    algorithm = cfg.trainer.algorithm
    assert algorithm.advantage_estimator == "rloo"  # leave-one-out without std
    assert (algorithm.policy_loss_type, algorithm.clip_ratio_c, algorithm.loss_reduction) == (
        "dual_clip",
        3.0,
        "sequence_mean",
    )
    assert algorithm.dynamic_sampling.type == "filter"
    correction = algorithm.off_policy_correction
    assert (correction.token_mask_is_threshold_low, correction.token_mask_is_threshold_high) == (0.5, 5.0)
    refused = _refused(["loss_fn.use_importance_sampling_correction=true"])
    assert "uncapped weights" in refused["loss_fn.use_importance_sampling_correction"]


def test_nemo_kl_in_reward_and_lora():
    cfg = load_config(
        [
            "loss_fn.use_kl_in_reward=true",
            "loss_fn.reference_policy_kl_penalty=0.05",
            "policy.dtensor_cfg.enabled=true",
            "policy.dtensor_cfg.lora_cfg.enabled=true",
            "policy.dtensor_cfg.lora_cfg.dim=16",
            "policy.dtensor_cfg.lora_cfg.alpha=32",
            "policy.dtensor_cfg.lora_cfg.match_all_linear=true",
        ]
    )
    algorithm = cfg.trainer.algorithm
    assert (algorithm.use_kl_in_reward, algorithm.use_kl_loss, algorithm.kl_loss_coef) == (True, False, 0.05)
    lora = cfg.trainer.policy.model.lora
    assert (lora.rank, lora.alpha, lora.target_modules) == (16, 32.0, ["all-linear"])


def test_other_algorithms_get_one_line_each(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "sft": {f"key_{index}": index for index in range(30)},
                "dpo": {"reference_policy_kl_penalty": 0.1, "preference_loss_weight": 1},
            }
        )
    )
    refused = _refused(config_file=str(path))
    assert set(refused) == {"sft", "dpo"}
    assert "supervised fine-tuning (SFT)" in refused["sft"] and "//rl/launch:sft" in refused["sft"]


# --- seeds --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SEED_KEYS))
def test_every_seed_key_loads(name, tmp_path, caplog):
    seed = SEED_KEYS[name]
    path = None
    if seed.yaml:
        path = tmp_path / "seed.yaml"
        path.write_text(seed.yaml, encoding="utf-8")
    cfg = _load(caplog, seed.overrides, str(path) if path else None)
    if name == "seed003_both_enabled":
        assert cfg.trainer.strategy == "megatron"
    if name == "seed003_basic":  # max_seq_length bounds prompt + response; 4 x 8 x DP 1 = 32 sequences per step
        assert cfg.generator.max_prompt_length + cfg.generator.max_generate_length == 1024
        assert cfg.trainer.micro_train_batch_size_per_gpu == 4
        assert cfg.trainer.policy_mini_batch_size * cfg.generator.n_samples_per_prompt == 32
    if name == "seed003_advanced":  # 2 x 4 x DP (8 / (TP 2 * PP 2) = 2) = 16 sequences per optimizer step
        assert cfg.trainer.policy_mini_batch_size * cfg.generator.n_samples_per_prompt == 16
        assert cfg.trainer.policy.optimizer_config.betas == [0.9, 0.98]
        assert cfg.trainer.policy.optimizer_config.lr_warmup_steps == 10
    if name == "seed004_moe":
        block = cfg.blocks["trainer.policy.megatron_config"]
        assert block.transformer_config_kwargs["recompute_modules"] == ["mlp"]
        assert block.recompute_granularity == "selective"
    if name == "seed000_memory":
        assert cfg.trainer.gradient_checkpointing is True


# --- suggestions and the saved config -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "wrong"),
    [
        ("generator.inference_engine.bakend", "num_inference_engines"),
        ("generator.sampling_params.temprature", "eval_temperature"),
        ("generator.sampling_params.top_pp", "n_samples_per_prompt"),
        ("trainer.eval_batch_sze", "train_batch_size"),
    ],
)
def test_suggestions_never_name_a_key_of_another_meaning(key, wrong):
    line = _refused([f"{key}=1"])[key]
    assert wrong not in line.split("; valid keys")[0]


def test_a_key_with_no_equivalent_gets_no_suggestion():
    line = _refused(["generator.inference_engine.quantization=fp8"])["generator.inference_engine.quantization"]
    assert "did you mean" not in line


def test_saved_config_holds_only_our_keys(tmp_path, caplog):
    cfg = _load(caplog, skyrl_args("gsm8k"))
    path = str(tmp_path / "config.yaml")
    save_config(cfg, path)
    with open(path, encoding="utf-8") as handle:
        saved = yaml.safe_load(handle)
    ours = set(all_keys())

    def walk(node, prefix=""):
        for name, value in node.items():
            key = prefix + name
            if any(key.startswith(free + ".") for free in ("deepspeed_config.train",)):
                continue
            assert key in ours, key
            if isinstance(value, dict) and not key.endswith(("kwargs", "env_options", ".train")):
                walk(value, key + ".")

    walk(saved)
    assert load_config([], config_file=path) == cfg
    assert config_to_dict(load_config([], config_file=path)) == config_to_dict(cfg)
    assert os.path.getsize(path) > 0
