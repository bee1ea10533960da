"""The `sft:` and `dpo:` blocks (`rl.core.config.supervised`): checked as the loader checks its keys (an unknown key
named with a suggestion, a wrong type naming the key), NeMo RL's `sft:` / `dpo:` keys read with their meaning there
(NeMo RL's examples/configs/sft.yaml and dpo.yaml at 7ea279a, 2026-08-22: the blocks below are theirs, keys and
values), a differing meaning printed, an unsupported key refused naming it; and the run directory's config.yaml
holding the block, so that the same launcher reads back the same job from it."""

import pytest

import rl.backends.registry  # noqa: F401  (registers the training strategies the config names)
from rl.core.config import ConfigError, load_config
from rl.core.config.supervised import (
    DpoConfig,
    SftConfig,
    save_supervised_config,
    split_overrides,
    supervised_config_dict,
)

NEMO_DPO_BLOCK = """dpo:
  max_num_epochs: 1
  max_num_steps: 150
  val_period: 25
  val_batches: 0
  val_global_batch_size: 8
  val_micro_batch_size: 1
  val_at_start: true
  val_at_end: false
  seed: 42
  reference_policy_kl_penalty: 0.05
  preference_average_log_probs: False
  sft_average_log_probs: ${.preference_average_log_probs}
  preference_loss_weight: 1
  sft_loss_weight: 0
"""
"""NeMo RL's dpo.yaml block, but for `val_batches` (8 there: see the refusal below)."""
NEMO_SFT_BLOCK = """sft:
  max_num_epochs: 1
  max_num_steps: 60
  val_period: 10
  val_batches: 0
  val_global_batch_size: 32
  val_micro_batch_size: 1
  val_at_start: true
  val_at_end: false
  seed: 42
  only_unmask_final: false
"""


def _refused(section, overrides, config_file=None) -> str:
    with pytest.raises(ConfigError) as error:
        split_overrides(section, overrides, config_file)
    return str(error.value)


def test_nemo_rl_dpo_block_means_what_it_means_there(tmp_path):
    path = tmp_path / "dpo.yaml"
    path.write_text(NEMO_DPO_BLOCK + "trainer:\n  train_batch_size: 32\n")
    args = split_overrides("dpo", ["trainer.max_steps=3"], str(path))
    assert args.block == DpoConfig(beta=0.05, preference_loss_weight=1.0, sft_loss_weight=0.0,
                                   sft_average_log_probs=False, preference_average_log_probs=False)
    cfg = load_config(args.overrides, config_file=args.config_file)
    # the command line wins over the file's max_num_steps, as over any key of the file
    assert (cfg.trainer.max_steps, cfg.trainer.epochs, cfg.trainer.eval_interval) == (3, 1, 25)
    assert (cfg.trainer.eval_before_train, cfg.trainer.seed, cfg.trainer.train_batch_size) == (True, 42, 32)
    notes = "\n".join(args.notes)
    assert "dpo.max_num_steps (NeMo RL): trainer.max_steps wins over trainer.epochs here" in notes
    assert "dpo.max_num_epochs (NeMo RL)" in notes
    for inert in ("dpo.val_at_end", "dpo.val_batches", "dpo.val_global_batch_size", "dpo.val_micro_batch_size"):
        assert inert in notes.split("accepted with no effect here:")[1]


def test_nemo_rl_sft_block_and_the_keys_it_cannot_have(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text(NEMO_SFT_BLOCK)
    args = split_overrides("sft", [], str(path))
    assert args.block == SftConfig()
    cfg = load_config(args.overrides, config_file=args.config_file)
    assert (cfg.trainer.max_steps, cfg.trainer.eval_interval, cfg.trainer.seed) == (60, 10, 42)
    assert "sft.only_unmask_final" in args.notes[-1]
    message = _refused("sft", ["sft.only_unmask_final=true"])
    assert "sft.only_unmask_final: is True, which asks for the loss on the final assistant turn only" in message
    message = _refused("dpo", ["dpo.val_batches=8"])
    assert "dpo.val_batches: is 8, which asks for evaluating only the first val_batches batches" in message
    message = _refused("dpo", ["dpo.preference_loss=rpo_sq"])
    assert "dpo.preference_loss: 'rpo_sq' cannot be read as dpo.loss_type" in message


def test_preference_loss_names_and_beta():
    assert split_overrides("dpo", ["dpo.preference_loss=dpo"], None).block.loss_type == "sigmoid"
    assert split_overrides("dpo", ["dpo.preference_loss=ipo"], None).block.loss_type == "ipo"
    assert split_overrides("dpo", ["dpo.reference_policy_kl_penalty=0.3"], None).block.beta == 0.3


def test_skyrl_names_go_to_the_trainer():
    args = split_overrides("sft", ["sft.messages_key=conversation", "sft.num_steps=7", "sft.batch_size=16",
                                   "trainer.seed=3"], None)
    assert args.block == SftConfig(messages_key="conversation")
    assert sorted(args.overrides) == ["trainer.max_steps=7", "trainer.seed=3", "trainer.train_batch_size=16"]


@pytest.mark.parametrize(("section", "overrides", "line"), [
    ("sft", ["sft.max_lenght=64"], "sft.max_lenght: unknown key (did you mean 'sft.max_length'?); valid keys under "
     "sft: messages_key,"),
    ("dpo", ["dpo.bta=0.2"], "dpo.bta: unknown key (did you mean 'dpo.beta'?)"),
    ("sft", ["sft.max_length=long"], "sft.max_length: expected an integer, got 'long' (a string)"),
    ("dpo", ["dpo.beta=high"], "dpo.beta: expected a number, got 'high' (a string)"),
    ("dpo", ["dpo.truncate=3"], "dpo.truncate: expected true or false, got 3 (an integer)"),
    ("dpo", ["dpo.loss_type=hinge"], "dpo.loss_type: 'hinge' is not one of sigmoid, ipo"),
    ("dpo", ["dpo.beta=0"], "dpo.beta: must be > 0, got 0.0"),
    ("dpo", ["dpo.sft_loss_weight=-1"], "dpo.sft_loss_weight: must be >= 0, got -1.0"),
    ("sft", ["sft.max_length=1"], "sft.max_length: must be >= 2, got 1"),
    ("sft", ["sft.loss_reduction=seq_mean"], "sft.loss_reduction: 'seq_mean' is not one of token_mean, sequence_mean"),
    ("sft", ["dpo.beta=0.2"], "dpo.beta: is the block of rl.launch.dpo"),
])
def test_bad_keys_are_named(section, overrides, line):
    assert f"  - {line}" in _refused(section, overrides)


def test_bad_keys_in_the_file_are_named(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("sft:\n  max_length: '64'\n  mesages_key: chat\ndpo:\n  beta: 0.1\n")
    message = _refused("sft", [], str(path))
    assert "sft.max_length: expected an integer, got '64' (a string)" in message
    assert "sft.mesages_key: unknown key (did you mean 'sft.messages_key'?)" in message
    assert "dpo: is the block of rl.launch.dpo" in message


def test_run_config_reads_back_the_same_job(tmp_path):
    args = split_overrides("dpo", ["dpo.beta=0.25", "dpo.loss_type=ipo", "dpo.chosen_key=good", "dpo.max_length=99",
                                   "trainer.max_steps=5", "trainer.seed=7"], None)
    cfg = load_config(args.overrides, config_file=args.config_file)
    path = tmp_path / "config.yaml"
    save_supervised_config(cfg, "dpo", args.block, str(path))
    again = split_overrides("dpo", [], str(path))
    assert again.block == args.block
    reloaded = load_config(again.overrides, config_file=again.config_file)
    assert supervised_config_dict(reloaded, "dpo", again.block) == supervised_config_dict(cfg, "dpo", args.block)
    assert "dpo:" in path.read_text() and "beta: 0.25" in path.read_text()
