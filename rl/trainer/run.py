"""Runs one training job: the run directory, Ray's lifetime around the trainer, and the final curve."""

from __future__ import annotations

import datetime
import os
import time

from rl.core.config import save_config
from rl.core.sandbox import allow_weaker_isolation
from rl.trainer.preflight.checks import preflight
from rl.trainer.startup import StartupClock
from rl.trainer.state import checkpoint
from rl.trainer.state.plots import plot_curves


class Interrupted(Exception):
    """Ctrl-C ended the run (Ray is shut down by then); what the user needs to know to go on."""

    def __init__(self, step: int, latest_checkpoint: str | None):
        self.step, self.latest_checkpoint = step, latest_checkpoint
        where = (f"last complete checkpoint: {latest_checkpoint} (resume with trainer.resume_mode=latest)"
                 if latest_checkpoint else "no complete checkpoint yet")
        super().__init__(f"interrupted at step {step}; {where}")


class RunFailed(Exception):
    """The run ended on an error it names (Ray is shut down by then), and where it stands."""

    def __init__(self, what: str, step: int, latest_checkpoint: str | None):
        where = (f"last complete checkpoint: {latest_checkpoint} (resume with trainer.resume_mode=latest)"
                 if latest_checkpoint else "no complete checkpoint yet")
        super().__init__(f"{what} at step {step}; {where}")


class ActorFailed(RunFailed):
    """A worker or an engine of the run died or stopped answering: which one, and where the run stands."""


ACTOR_KINDS = {"EngineActor": "a generation engine", "TrainingWorker": "a training worker",
               "RewardModelActor": "a reward model"}
"""What each of the run's Ray actor classes is, for an actor that died before the run knew its name."""
FAILURE_FILE = "actor_failure.txt"


def _actor_failure(trainer, error: Exception, run_dir: str) -> str | None:
    """What happened to which actor, or None when `error` names no actor. An actor that died of an exception (in its
    construction, most often) or whose call raised one is named with that exception's type and message, and the
    whole traceback goes to RUN_DIR/actor_failure.txt, whose path the line gives."""
    from ray.exceptions import RayActorError

    from rl.trainer.workers.waiting import ActorHung, first_line

    if isinstance(error, ActorHung):
        return str(error)
    names = trainer.actor_names() if trainer is not None else {}
    text = _plain(str(error))
    cause = _raised(text)
    if isinstance(error, RayActorError):
        who = names.get(getattr(error, "actor_id", None) or "") or _actor_in(text)[0]
        if cause is None:
            return f"{who} died ({first_line(error)})"
        during = " in its construction" if getattr(error, "actor_init_failed", False) else ""
        return f"{who} died{during}: {cause} (traceback: {_keep_traceback(text, run_dir)})"
    dead = trainer.dead_actor() if trainer is not None else None  # a survivor's collective failed first
    if dead:
        return _in_a_peer(dead, error)
    who, method = _actor_in(text)
    if cause is None or method is None:
        return None
    who = names.get(getattr(error, "actor_id", None) or "") or who
    return f"{who} failed in {method}(): {cause} (traceback: {_keep_traceback(text, run_dir)})"


def _in_a_peer(dead: str, error: Exception) -> str:
    """"training worker rank 1 (...) died (RuntimeError in a peer)": a survivor's collective fails as its peer dies,
    and the survivor's error can reach the driver before the death does."""
    return f"{dead} died ({type(getattr(error, 'cause', error)).__name__} in a peer)"


def _actor_lost(trainer, error: Exception, run_dir: str) -> tuple[str, str] | None:
    """What was lost and the kind of recovery it takes (`restarts.ENGINE` or `restarts.WORKER`), for an actor that
    died or hung, or one whose peer died under it; None for an exception of a live actor among live peers, which a
    new start would only raise again."""
    from ray.exceptions import RayActorError

    from rl.trainer.workers.restarts import ENGINE, WORKER
    from rl.trainer.workers.waiting import ActorHung

    if isinstance(error, ActorHung):
        names, what = error.names, _actor_failure(trainer, error, run_dir)
    elif isinstance(error, RayActorError):
        names = [(trainer.actor_names() if trainer is not None else {}).get(getattr(error, "actor_id", None) or "")
                 or _actor_in(_plain(str(error)))[0]]
        what = _actor_failure(trainer, error, run_dir)
    else:
        dead = trainer.dead_actor() if trainer is not None else None
        names, what = [dead], (None if dead is None else _in_a_peer(dead, error))
    if what is None:
        return None
    return what, ENGINE if names and all("generation engine" in name for name in names) else WORKER


def _keep_traceback(text: str, run_dir: str) -> str:
    path = os.path.join(run_dir, FAILURE_FILE)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return path


def _plain(text: str) -> str:
    """Ray's message without its terminal colours."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _actor_in(text: str) -> tuple[str, str | None]:
    """("a generation engine (EngineActor, pid 238)", "__init__") from Ray's "ray::EngineActor.__init__() (pid=238,
    ...)"; ("an actor of the run", None) where Ray's message names none."""
    import re

    found = re.search(r"ray::(\w+)\.(\w+)\(\) \(pid=(\d+)", text)
    if found is None:
        return "an actor of the run", None
    kind = ACTOR_KINDS.get(found.group(1), "an actor of the run")
    return f"{kind} ({found.group(1)}, pid {found.group(3)})", found.group(2)


def _raised(text: str) -> str | None:
    """The exception a traceback in Ray's message ends with ("ValueError: ..."), None without one."""
    import re

    if not re.search(r'^\s*File "', text, re.MULTILINE):
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure|Fault)\w*(: |$)", line):
            return line
    return None


def resuming(cfg):
    """`cfg` resuming from the newest complete checkpoint, or from the start (its metrics rows dropped) without
    one: the setting a person would pass to resume the run by hand."""
    import dataclasses

    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, resume_mode="latest"))


def _tear_down(trainer, started) -> None:
    """Ends every actor of the run (the dead one's peers hold collectives and ports of the old group) and gives the
    cluster their bundles back, for the next start."""
    import ray

    if trainer is not None:
        trainer.close()
        actors = trainer.actors()
    else:
        groups = [g for g in (started.group, started.ref_group, started.critic_group) if g is not None] if started \
            else []
        actors = [named for group in groups for named in group.named_actors()]
    for actor, _ in actors:
        ray.kill(actor, no_restart=True)
    if started is not None:
        started.placement.release()


def default_run_dir() -> str:
    """A new dated folder under runs/ in the workspace (`bazel run` says where that is)."""
    root = os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.getcwd()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join(root, "runs", stamp)


def prepare_run_dir(run_dir: str, resume_mode: str) -> str:
    """Creates the run dir; refuses to start a fresh run on top of another run's metrics."""
    run_dir = os.path.abspath(os.path.expanduser(run_dir))
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise FileExistsError(f"--run_dir {run_dir} is a file, not a directory; choose another --run_dir")
    if os.path.exists(os.path.join(run_dir, "metrics.jsonl")) and resume_mode in (None, "none"):
        raise FileExistsError(
            f"--run_dir {run_dir} already holds a run (metrics.jsonl); pass trainer.resume_mode=latest to continue "
            "it, or choose another --run_dir"
        )
    os.makedirs(run_dir, exist_ok=True)
    return run_dir


def run_training(cfg, run_dir: str | None = None, ray_address: str | None = None,
                 clock: StartupClock | None = None) -> str:
    """Trains as configured; returns the run directory. What this machine must provide is checked first
    (`preflight`: nothing is created before it passes); Ray is shut down on success, error and Ctrl-C. `clock`
    (by default, from the start of the process) times the start, printed once before the first step."""
    import torch
    from ray.exceptions import RayActorError, RayTaskError

    from rl.trainer.rewards.rewarding import RewardError
    from rl.trainer.rollout.sampling import SamplingExhausted
    from rl.trainer.state.finite import NonFiniteError
    from rl.trainer.state.write_faults import WriteFailed
    from rl.trainer.workers.placement import machine_cores, make_plan
    from rl.trainer.workers.restarts import RestartBudget
    from rl.trainer.workers.waiting import ActorHung
    from rl.trainer.workers.worker_group import start_ray, stop_ray
    from rl.trainer.workers.worker_start import start_workers

    clock = clock or StartupClock()
    clock.mark("imports")
    preflight(cfg, ray_address)
    # before any reward process or Ray worker starts: they read it from the environment they inherit
    allow_weaker_isolation(cfg.environment.sandbox.allow_weaker_isolation)
    run_dir = prepare_run_dir(run_dir or default_run_dir(), cfg.trainer.resume_mode)
    save_config(cfg, os.path.join(run_dir, "config.yaml"))
    print(f"run directory: {run_dir}", flush=True)
    clock.mark("preflight")
    start_ray(run_dir, ray_address, slots=make_plan(cfg, torch.cuda.is_available(), machine_cores()).slots)
    clock.mark("ray")
    trainer, started, restarts, failed_at, counted = None, None, 0, None, ""
    budget = RestartBudget(cfg.trainer.max_restarts, cfg.trainer.restart_window_steps)
    try:
        while True:
            try:
                started = start_workers(cfg)  # their processes come up while the driver imports and loads the rest
                from rl.trainer.loop import Trainer

                clock.mark("trainer imports")
                trainer = Trainer(cfg, run_dir, started, clock, restarts, budget)
                if failed_at is None:
                    print(clock.line(), flush=True)
                else:
                    print(f"recovered in {time.monotonic() - failed_at:.1f} s ({counted})", flush=True)
                trainer.fit()
                break
            except (RayActorError, RayTaskError, ActorHung) as error:
                lost = _actor_lost(trainer, error, run_dir)
                step = trainer.current_step if trainer is not None else 0
                if lost is None or not budget.take(lost[1], step):
                    raise
                what, kind = lost
                failed_at, restarts, counted = time.monotonic(), restarts + 1, budget.describe(kind, step)
                latest = checkpoint.latest(checkpoint.root_of(cfg, run_dir), log=lambda _: None)
                print(f"warning: {what} at step {step}; the run's actors start again from "
                      f"{latest or 'the first step'} ({counted})", flush=True)
                _tear_down(trainer, started)
                trainer, started = None, None
                cfg = resuming(cfg)
    except KeyboardInterrupt:
        step = trainer.current_step if trainer is not None else 0
        latest = checkpoint.latest(checkpoint.root_of(cfg, run_dir))
        raise Interrupted(step, latest) from None
    except (RayActorError, RayTaskError, ActorHung) as error:
        what = _actor_failure(trainer, error, run_dir)
        if what is None:
            raise
        latest = checkpoint.latest(checkpoint.root_of(cfg, run_dir), log=lambda _: None)
        raise ActorFailed(what, trainer.current_step if trainer is not None else 0, latest) from None
    except (RewardError, SamplingExhausted, NonFiniteError, WriteFailed) as error:
        latest = checkpoint.latest(checkpoint.root_of(cfg, run_dir), log=lambda _: None)
        raise RunFailed(str(error), trainer.current_step if trainer is not None else 0, latest) from None
    finally:
        if trainer is not None:
            trainer.close()
        stop_ray()
    curve = plot_curves(run_dir)
    if curve is not None:
        print(f"curve: {curve}", flush=True)
    return run_dir
