"""What `rl.launch.sft` and `rl.launch.dpo` share: flags, the config (the RL loader for every key but the `sft:` /
`dpo:` block, `rl.core.config.supervised`), the exit codes of `rl.launch.train`."""

from __future__ import annotations

import sys

from absl import flags

from rl.backends.registry import STRATEGIES

FLAGS = flags.FLAGS
flags.DEFINE_string("strategy", None, f"Training backend, one of the registered strategies "
                    f"({', '.join(STRATEGIES.names())}); overrides trainer.strategy.")
flags.DEFINE_string("config", None, "YAML file layered over the defaults, before key=value overrides.")
flags.DEFINE_string("run_dir", None, "Directory for the run's outputs (default: a new dated folder under runs/).")
flags.DEFINE_string("ray_address", None, "Address of an existing Ray cluster to join (default: start a local one).")


def main(section: str, argv: list[str]) -> int:
    from rl.core.config import ConfigError, load_config
    from rl.core.config.supervised import split_overrides
    from rl.core.data.errors import DataError
    from rl.trainer.write_faults import WriteFailed

    try:
        block, overrides, config_file = split_overrides(section, argv[1:], FLAGS.config)
        cfg = load_config(overrides, config_file=config_file, strategy=FLAGS.strategy)
    except ConfigError as error:
        print(f"invalid configuration:\n{error}", file=sys.stderr)
        return 2
    if section == "sft":
        from rl.trainer.sft_loop import run_sft as run
    else:
        from rl.trainer.dpo_loop import run_dpo as run
    try:
        run_dir = run(cfg, block, FLAGS.run_dir, FLAGS.ray_address)
    except DataError as error:
        print(f"bad data: {error}", file=sys.stderr)
        return 2
    except (FileExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except WriteFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(f"done: {run_dir}", flush=True)
    return 0
