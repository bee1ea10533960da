"""What must hold before an SFT or DPO run spends anything (a run directory, the embedded model, Ray): the data
files read and every row is well-formed (the file and row named), they hold a step's examples, the policy's model
is at hand, checkpoints and exports can be written, a checkpoint to resume is complete, intact and of this strategy,
the kernels can run here and the placement fits this machine. The checks are the RL launcher's
(`rl.trainer.preflight.checks`) where the two share them; every problem is reported at once as a ConfigError naming the
key. What needs the tokenizer (an example longer than `max_length`) is checked when the data is encoded, before Ray."""

from __future__ import annotations

from rl.core.config import ConfigError
from rl.core.data import DataError
from rl.core.data.supervised import SupervisedDataSpec, check_rows
from rl.tasks.jobs import EMBEDDED
from rl.trainer.preflight.checks import (
    _kernel_problems,
    _model_path_problems,
    _placement_problems,
    _resume_problems,
    _writable_problems,
)


def data_spec(section: str, block) -> SupervisedDataSpec:
    """The columns and length rule of the `sft:` / `dpo:` block."""
    if section == "sft":
        return SupervisedDataSpec(messages_key=block.messages_key, prompt_key=block.prompt_key,
                                  response_key=block.response_key, max_length=block.max_length,
                                  truncate=block.truncate, section="sft")
    return SupervisedDataSpec(prompt_key=block.prompt_key, chosen_key=block.chosen_key,
                              rejected_key=block.rejected_key, max_length=block.max_length, truncate=block.truncate,
                              section="dpo")


def _data_problems(cfg, section: str, block) -> list[str]:
    """Each data file's rows checked as far as the tokenizer is not needed; the training rows fill a step. Prompt
    templates build the RL launcher's prompts; here the rows are used as written, so one set would do nothing."""
    found, spec = [], data_spec(section, block)
    for key in ("prompt_template_file", "system_prompt_file"):
        if getattr(cfg.data, key) is not None:
            found.append(f"data.{key}: builds the prompts of GRPO/PPO runs (rl.launch.train); {section} rows are "
                         f"used as the data holds them: set it to null and write the prompts into the rows")
    if cfg.data.val_split_size:
        found.append(f"data.val_split_size: carves the validation prompts of GRPO/PPO runs (rl.launch.train); "
                     f"{section} evaluates the rows of data.val_data: set it to 0 and give data.val_data")
    what = "pairs" if section == "dpo" else "examples"
    for key, paths in (("data.train_data", cfg.data.train_data), ("data.val_data", cfg.data.val_data or [])):
        given = [path for path in paths if path != EMBEDDED]
        if not given:
            continue
        try:
            rows = check_rows(given, spec, paired=section == "dpo")
        except DataError as error:
            found.append(f"{key}: {error}")
            continue
        if key == "data.train_data" and len(given) == len(paths) and rows < cfg.trainer.train_batch_size:
            found.append(f"trainer.train_batch_size: {cfg.trainer.train_batch_size} {what} per step, but "
                         f"data.train_data holds {rows}; lower trainer.train_batch_size or add {what}")
    return found


def _model_problems(cfg) -> list[str]:
    """The policy's model (the only one a supervised run loads; DPO's reference is its starting weights)."""
    path = cfg.trainer.policy.model.path
    return [] if path == EMBEDDED else _model_path_problems("trainer.policy.model.path", path)


def supervised_preflight(cfg, section: str, block, ray_address: str | None = None) -> None:
    """Raises ConfigError listing every problem found (see the module docstring)."""
    problems = [*_data_problems(cfg, section, block), *_model_problems(cfg), *_resume_problems(cfg),
                *_writable_problems(cfg), *_kernel_problems(cfg, ray_address), *_placement_problems(cfg, ray_address)]
    if problems:
        raise ConfigError(problems)
