"""`bazel run //rl/launch:train -- [--strategy=S|auto] [--config=FILE.yaml] [--run_dir=DIR] [key=value ...]`

Trains a policy with GRPO/PPO. With no arguments it runs the embedded default: a small model on a synthetic task
on CPU. Positional `key=value` arguments override config keys (lists as "['a','b']").
"""

import sys

from absl import flags

from rl.backends.registry import STRATEGIES
from rl.core.config import ConfigError, load_config
from rl.launch import cli
from rl.launch.environment import apply_environment
from rl.trainer.preflight.memory_plan import resolve_auto

FLAGS = flags.FLAGS
FSDP1_NOTE = ("trainer.strategy=fsdp is FSDP1 (torch's FullyShardedDataParallel) here; SkyRL's fsdp is FSDP2 "
              "(fully_shard) since May 2026: set trainer.strategy=fsdp2 for that")
WHOLE_CALLS_NOTE = ("trainer.fully_async: each generation call finishes under the weights it started with; SkyRL's "
                    "fully async updates the engines' weights mid-generation: set "
                    "trainer.fully_async.partial_rollout_tokens=N for that (pushes between segments of N tokens)")
flags.DEFINE_string("strategy", None, f"Training backend, one of the registered strategies "
                    f"({', '.join(STRATEGIES.names())}), or auto (the memory planner picks the strategy and its "
                    "layout); overrides trainer.strategy.")
flags.DEFINE_string("config", None, "YAML file layered over the defaults, before key=value overrides.")
flags.DEFINE_string("run_dir", None, "Directory for the run's outputs (default: a new dated folder under runs/).")
flags.DEFINE_string("ray_address", None, "Address of an existing Ray cluster to join (default: start a local one).")


def main(argv: list[str]) -> int:
    overrides = argv[1:]  # key=value each; the config loader names any that is not
    try:
        cfg = load_config(overrides, config_file=FLAGS.config, strategy=FLAGS.strategy, auto=resolve_auto)
        for line in apply_environment(cfg):
            print(line, flush=True)
    except ConfigError as error:
        return cli.refused(error)
    if cfg.trainer.auto_choice:
        print(f"trainer.strategy=auto chose {cfg.trainer.auto_choice}", flush=True)
    if cfg.trainer.strategy == "fsdp":
        print(FSDP1_NOTE, flush=True)
    if cfg.trainer.fully_async.enabled and not cfg.trainer.fully_async.partial_rollout_tokens:
        print(WHOLE_CALLS_NOTE, flush=True)
    from rl.trainer.run import Interrupted, RunFailed, run_training

    try:
        run_training(cfg, FLAGS.run_dir, FLAGS.ray_address)
    except ConfigError as error:  # what this machine lacks (rl.trainer.preflight.checks), found before Ray starts
        return cli.refused(error)
    except FileExistsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Interrupted as stop:
        print(stop, file=sys.stderr)
        return 130  # the shell's code for a SIGINT
    except RunFailed as failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    cli.run(main)
