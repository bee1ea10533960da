"""The finite-update guard (`trainer.non_finite`): a non-finite reward, loss or gradient norm never reaches the
weights. Rewards are looked at before advantages, the loss and gradient norm after each optimizer step (whose
backend has already dropped a non-finite one on every rank, `TrainingBackend.optimizer_step`), and a checkpoint is
committed only when every rank's weights are finite (`Trainer.save_checkpoint`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from rl.core.data.records import describe_row


class NonFiniteError(RuntimeError):
    """A non-finite value with trainer.non_finite=fail; the message names where it came from."""


SKIP_HINT = "set trainer.non_finite=skip to skip such steps and go on"


def non_finite_rewards(rewards: Tensor, rollouts: Sequence, records: Sequence, source: str, mode: str) -> int:
    """How many of `rewards` are not finite (`rollouts[b]` answers `records[rollouts[b].prompt_index]`, `source`
    says what scored them). With `mode` fail the first one ends the run, naming `source` and its row; with skip a
    warning names it and the caller skips the step's update."""
    bad = (~torch.isfinite(rewards)).nonzero().flatten()
    if not len(bad):
        return 0
    first = int(bad[0])
    where = describe_row(records[rollouts[first].prompt_index])
    line = (f"{source} gave reward {float(rewards[first])} on {where} ({len(bad)} non-finite reward(s) in this "
            "batch)")
    if mode == "fail":
        raise NonFiniteError(f"{line}; rewards must be finite numbers (or {SKIP_HINT})")
    print(f"warning: {line}; this step's update is skipped (trainer.non_finite=skip)", flush=True)
    return len(bad)


def finite_rewards_mean(rewards: Tensor) -> float:
    """The mean of the finite rewards (0.0 when none is)."""
    finite = rewards[torch.isfinite(rewards)]
    return float(finite.mean()) if finite.numel() else 0.0


def check_update(step: int, row: dict[str, float], mode: str) -> None:
    """After a step's policy update: with `mode` fail, a skipped optimizer step (a non-finite gradient norm, which
    the backend did not apply) or a non-finite loss ends the run naming the step; with skip it stays counted in
    `row["skipped_steps"]`."""
    skipped = row.get("skipped_steps", 0.0)
    loss, norm = row.get("loss", 0.0), row.get("grad_norm", 0.0)
    if mode == "skip" or (not skipped and math.isfinite(loss) and math.isfinite(norm)):
        return
    raise NonFiniteError(f"loss/grad norm at step {step} is not finite (loss {loss}, grad norm {norm}); the update "
                         f"was not applied and no checkpoint holds it ({SKIP_HINT})")


def non_finite_weights_line(step: int, workers: Sequence[str]) -> str:
    """What ends a run whose weights turned non-finite before the checkpoint of `step` (its directory stays
    `.partial`, never marked COMPLETE); `workers` names each worker at fault."""
    return (f"the weights on {', '.join(workers)} are not finite, so the checkpoint of step {step} was not "
            "committed")
