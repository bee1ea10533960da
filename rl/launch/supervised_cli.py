"""What `rl.launch.sft` and `rl.launch.dpo` share: flags, the config (the RL loader for every key but the `sft:` /
`dpo:` block, `rl.core.config.supervised`), the preflight before anything starts
(`rl.trainer.supervised.preflight`), the exit codes of `rl.launch.train`."""

from __future__ import annotations

import sys

from absl import flags

from rl.backends.registry import STRATEGIES
from rl.launch import cli

FLAGS = flags.FLAGS
_FLAGS = {
    "strategy": f"Training backend, one of the registered strategies ({', '.join(STRATEGIES.names())}); overrides "
                "trainer.strategy.",
    "config": "YAML file layered over the defaults, before key=value overrides.",
    "run_dir": "Directory for the run's outputs (default: a new dated folder under runs/).",
    "ray_address": "Address of an existing Ray cluster to join (default: start a local one).",
}
for _name, _help in _FLAGS.items():
    if _name not in FLAGS:  # rl.launch.train's flags of the same meaning, where a process imports both (tests)
        flags.DEFINE_string(_name, None, _help)


def main(section: str, argv: list[str]) -> int:
    from rl.core.config import ConfigError, load_config
    from rl.core.config.supervised import split_overrides
    from rl.core.data.errors import DataError
    from rl.launch.environment import apply_environment
    from rl.trainer.run import Interrupted
    from rl.trainer.state.write_faults import WriteFailed

    try:
        args = split_overrides(section, argv[1:], FLAGS.config)
        cfg = load_config(args.overrides, config_file=args.config_file, strategy=FLAGS.strategy)
        for line in apply_environment(cfg):
            print(line, flush=True)
    except ConfigError as error:
        return cli.refused(error)
    for note in args.notes:  # what the dialect tables did with the block's keys
        print(note, flush=True)
    if section == "sft":
        from rl.trainer.supervised.sft_loop import run_sft as run
    else:
        from rl.trainer.supervised.dpo_loop import run_dpo as run
    try:
        run_dir = run(cfg, args.block, FLAGS.run_dir, FLAGS.ray_address)
    except ConfigError as error:  # what this machine lacks (rl.trainer.supervised.preflight), found before anything
        return cli.refused(error)
    except DataError as error:
        print(f"bad data: {error}", file=sys.stderr)
        return 2
    except (FileExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except WriteFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except Interrupted as stop:  # the step and the checkpoint to resume from
        print(stop, file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before training began
        print("interrupted before the first step", file=sys.stderr)
        return 130
    print(f"done: {run_dir}", flush=True)
    return 0
