"""The launcher run in this process on input it must refuse: it returns 2 within seconds, before Ray starts (so no
actor exists) and before the run directory is created."""

from __future__ import annotations

import functools
import os
import time

REFUSED_WITHIN_S = 10


def launch_refused(run_dir: str, overrides: list[str], capsys, flags: tuple[str, ...] = (),
                   launcher: str = "train") -> str:
    """What the launcher printed on stderr while refusing `overrides` (and command-line `flags`); `launcher`:
    `train`, or `sft` / `dpo` (`rl.launch.supervised_cli`)."""
    import ray
    from absl import flags as absl_flags

    # imported here, not timed: a first import of torch can take seconds on a busy machine
    if launcher == "train":
        import rl.trainer.run
        from rl.launch import train

        main = train.main
    else:
        import rl.trainer.supervised.dpo_loop
        import rl.trainer.supervised.sft_loop  # noqa: F401
        from rl.launch import supervised_cli

        main = functools.partial(supervised_cli.main, launcher)

    absl_flags.FLAGS.unparse_flags()
    absl_flags.FLAGS([launcher, f"--run_dir={run_dir}", *flags])
    started = time.perf_counter()
    try:
        code = main([launcher, *overrides])
    finally:
        absl_flags.FLAGS.unparse_flags()
    message = capsys.readouterr().err
    assert code == 2, message
    assert time.perf_counter() - started < REFUSED_WITHIN_S, "refused before any expensive work"
    assert not os.path.exists(run_dir), "nothing is created before the checks pass"
    assert not ray.is_initialized(), "Ray never started"
    assert "Traceback" not in message, message
    return message
