"""NeMo RL's configs as its users write them: each key read as ours where the meaning is the same, the differences
printed, keys with no effect listed, missing features refused by name; NeMo RL's `defaults:` inheritance and
`${...}` interpolation; the seeds' keys (SkyRL's and NeMo RL's); suggestions by meaning; a saved config holds only
our keys. SkyRL's own configs: test_config_skyrl_dialect.py."""

from __future__ import annotations

import os
import textwrap

import pytest
import yaml

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import ConfigError, config_to_dict, load_config, save_config
from rl.core.config.keys import all_keys
from tests.rl.core.config.dialect_loading import config_lines, load_logged, refusals
from tests.rl.core.config.skyrl_scripts import skyrl_args
from tests.rl.core.config.upstream_configs import NEMO_1B, NEMO_1B_MEGATRON, SEED_KEYS


# --- NeMo RL's files ----------------------------------------------------------------------------------------------
def _pointed(tmp_path, parent: str, extra: str = "") -> str:
    """A NeMo RL child file over `parent` with the data and the prompt template pointed at local files, as a NeMo RL
    user would write it."""
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    for path in (train, val):
        path.write_text('{"input": "1+1?", "output": "2"}\n', encoding="utf-8")  # ResponseDataset's columns
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
    refused = refusals(config_file=NEMO_1B)
    assert set(refused) == {
        "data.train.dataset_name",
        "data.prompt_template_file",  # data.default.prompt_file, NeMo RL's examples/prompts/cot.txt: not here
    }, refused
    assert "downloads by name" in refused["data.train.dataset_name"]
    assert refused["data.prompt_template_file"].startswith(
        f"data.prompt_template_file: examples/prompts/cot.txt (read as {os.getcwd()}/examples/prompts/cot.txt) does "
        "not exist; "
    )


def test_nemo_1b_meanings(tmp_path, caplog):
    cfg = load_logged(caplog, config_file=_pointed(tmp_path, NEMO_1B, "grpo:\n  max_num_steps: 20\n"))
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
    # the recipe's OpenMathInstruct-2 split (0.05, seeded by grpo.seed), evaluated with the validation file
    assert (cfg.data.val_split_size, cfg.data.val_split_seed) == (0.05, 42)
    assert (cfg.data.prompt_key, cfg.data.answer_key) == ("input", "output")  # ResponseDataset's defaults
    assert (cfg.data.reward_fn, cfg.data.reward_num_workers) == (["gsm8k_flexible"], 8)
    assert (cfg.data.prompt_template_file, cfg.data.system_prompt_file) == (str(tmp_path / "cot.txt"), None)
    lines = config_lines(caplog)
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
    cfg = load_logged(caplog, [*data, f"data.default.prompt_file={other}", f"data.train.prompt_file={cot}",
                         f"data.validation.prompt_file={cot}", f"data.default.system_prompt_file={system}"])
    assert (cfg.data.prompt_template_file, cfg.data.system_prompt_file) == (str(cot), str(system))
    inert = next(line for line in config_lines(caplog) if "accepted with no effect here" in line)
    assert "data.default.prompt_file (prompt_file of data.train / data.validation is used)" in inert
    cfg = load_config([f"data.prompt_file={cot}", "data.system_prompt_file=null"])  # NeMo RL's older layout
    assert (cfg.data.prompt_template_file, cfg.data.system_prompt_file) == (str(cot), None)
    refused = refusals([*data, f"data.default.prompt_file={cot}", "data.validation.prompt_file=null"])
    assert refused["data.validation.prompt_file"] == (
        f"data.validation.prompt_file: gives the validation data None and the training data '{cot}'; one file "
        "serves every prompt here (data.prompt_template_file): give both the same"
    )


def test_nemo_response_dataset_columns_and_split(tmp_path, caplog):
    """ResponseDataset's input_key / output_key (a dataset's own over data.default's, `input` / `output` when none
    is given) and its split_validation_size / seed, as NeMo RL's ResponseDataset reads them."""
    data = [f"data.train.data_path={tmp_path}/t.jsonl", f"data.validation.data_path={tmp_path}/v.jsonl"]
    cfg = load_logged(caplog, [*data, "data.default.input_key=problem", "data.train.output_key=expected_answer",
                               "data.validation.output_key=expected_answer", "data.train.split_validation_size=64",
                               "data.train.seed=3"])
    assert (cfg.data.prompt_key, cfg.data.answer_key) == ("problem", "expected_answer")
    assert (cfg.data.val_split_size, cfg.data.val_split_seed, cfg.data.val_data) == (64, 3, [f"{tmp_path}/v.jsonl"])
    cfg = load_logged(caplog, [data[0], "data.train.split_validation_size=0.1"])
    assert (cfg.data.prompt_key, cfg.data.answer_key, cfg.data.val_split_seed) == ("input", "output", 42)
    assert "ResponseDataset reads the 'input' column when input_key is not given" in "\n".join(config_lines(caplog))
    refused = refusals([*data, "data.train.input_key=problem", "data.validation.split_validation_size=0.5"])
    assert refused["data.validation.input_key"].endswith(
        "gives the validation data column 'input' and the training data 'problem'; one column serves every file "
        "here (data.prompt_key): give both the same")
    assert "data.validation's rows are evaluated whole" in refused["data.validation.split_validation_size"]


def test_nemo_decay_schedules():
    """Megatron-Core's lr_decay_style / lr_decay_iters / min_lr and torch's CosineAnnealingLR after a LinearLR
    warm-up are our cosine / linear decays; the recipes' constant style keeps min_lr inert."""
    sch, opt = "policy.megatron_cfg.scheduler.", "policy.megatron_cfg.optimizer."
    cfg = load_config(["policy.megatron_cfg.enabled=true", f"{sch}lr_decay_style=linear", f"{sch}lr_decay_iters=500",
                       f"{sch}lr_warmup_iters=10", f"{opt}min_lr=1e-7"])
    got = cfg.trainer.policy.optimizer_config
    assert (got.scheduler, got.lr_decay_steps, got.lr_warmup_steps, got.min_lr) == ("linear", 500, 10, 1e-7)
    cfg = load_config(["policy.megatron_cfg.enabled=true", f"{sch}lr_decay_style=constant", f"{opt}min_lr=1e-7"])
    assert (cfg.trainer.policy.optimizer_config.scheduler, cfg.trainer.policy.optimizer_config.min_lr) == (
        "constant", 0.0)
    warm_then_cosine = ("policy.scheduler=[{name: torch.optim.lr_scheduler.LinearLR, kwargs: {start_factor: 0.1, "
                        "end_factor: 1.0, total_iters: 10}}, {name: torch.optim.lr_scheduler.CosineAnnealingLR, "
                        "kwargs: {T_max: 90, eta_min: 1.0e-8}}, {milestones: [10]}]")
    got = load_config([warm_then_cosine]).trainer.policy.optimizer_config
    assert (got.scheduler, got.lr_warmup_steps, got.lr_decay_steps, got.min_lr) == ("cosine", 10, 100, 1e-8)
    refused = refusals(["policy.megatron_cfg.enabled=true", f"{sch}lr_decay_style=WSD"])
    assert "the decays here are cosine, linear" in refused[f"{sch}lr_decay_style"]


def test_nemo_1b_megatron_inherits_and_ignores_the_disabled_dtensor_block(tmp_path, caplog):
    cfg = load_logged(caplog, config_file=_pointed(tmp_path, NEMO_1B_MEGATRON))
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
    inert = next(line for line in config_lines(caplog) if "accepted with no effect here" in line)
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
    (tmp_path / "orphan.yaml").write_text("defaults: gone.yaml\n")
    with pytest.raises(ConfigError) as missing:
        load_config([], config_file=str(tmp_path / "orphan.yaml"))
    assert missing.value.problems == [f"config file {tmp_path / 'gone.yaml'} (named in defaults: of "
                                      f"{tmp_path / 'orphan.yaml'}): cannot be read (No such file or directory); "
                                      "check the path"]


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
    refused = refusals(["loss_fn.use_importance_sampling_correction=true"])
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
    refused = refusals(config_file=str(path))
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
    cfg = load_logged(caplog, seed.overrides, str(path) if path else None)
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
    line = refusals([f"{key}=1"])[key]
    assert wrong not in line.split("; valid keys")[0]


def test_a_key_with_no_equivalent_gets_no_suggestion():
    line = refusals(["generator.inference_engine.quantization=fp8"])["generator.inference_engine.quantization"]
    assert "did you mean" not in line


def test_saved_config_holds_only_our_keys(tmp_path, caplog):
    cfg = load_logged(caplog, skyrl_args("gsm8k"))
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


def test_the_peers_kv_cache_in_bytes_lands_on_our_key():
    """SkyRL (its 2026 engine_init_kwargs) and NeMo RL (vllm_kwargs) pass vLLM's kv_cache_memory_bytes in their
    free-form engine mappings; it is generator.kv_cache_memory_bytes here, and the rest of the mapping stays
    engine_init_kwargs. In our own engine_init_kwargs (SkyRL's 2025 spelling) it is refused for the key."""
    for given in ("generator.inference_engine.engine_init_kwargs={kv_cache_memory_bytes: 1048576, swap_space: 2}",
                  "policy.generation.vllm_kwargs={kv_cache_memory_bytes: 1048576, swap_space: 2}"):
        cfg = load_config(["generator.backend=vllm", given])
        assert (cfg.generator.kv_cache_memory_bytes, cfg.generator.engine_init_kwargs) == (1048576, {"swap_space": 2})
    key = "generator.engine_init_kwargs.kv_cache_memory_bytes"
    assert refusals(["generator.backend=vllm", f"{key}=1048576"]) == {
        key: f"{key}: is set by generator.kv_cache_memory_bytes: give that instead"}
    key = "generator.kv_cache_memory_bytes"
    assert refusals(["generator.backend=vllm", f"{key}=0"]) == {key: f"{key}: got 0; set it to null or a number of "
                                                                     "bytes >= 1"}
