"""The learning rate of each optimizer step (rl.core.algorithms.lr_schedule) against the peers whose schedules the
keys name: transformers' cosine and linear schedules with warm-up (SkyRL's `scheduler`), Megatron-Core's
OptimizerParamScheduler (NeMo RL's megatron `lr_decay_style`, `min_lr`, `lr_decay_iters`) and torch's
CosineAnnealingLR after a LinearLR warm-up (NeMo RL's scheduler list), step by step."""

import pytest
import torch
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

from rl.core.algorithms.lr_schedule import lr_factor
from tests.testing import tolerances

LR, STEPS = 1e-2, 40


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)


def _rates(scheduler) -> list[float]:
    """The rate each optimizer step runs at: the group's lr before the step, the scheduler stepped after it."""
    optimizer = scheduler.optimizer
    rates = []
    for _ in range(STEPS):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("warmup", [0, 5])
@pytest.mark.parametrize(("name", "theirs"), [("cosine", get_cosine_schedule_with_warmup),
                                              ("linear", get_linear_schedule_with_warmup)])
def test_transformers_schedules_after_the_warm_up(name, theirs, warmup):
    """Equal from the end of the warm-up (transformers' first warm-up step has rate 0; ours lr / warmup) to the
    last training step (past it transformers' cosine turns back up; the run has no such step)."""
    want = _rates(theirs(_optimizer(), num_warmup_steps=warmup, num_training_steps=30))
    ours = [LR * lr_factor(step, warmup, name, decay_steps=30) for step in range(STEPS)]
    assert ours[warmup:31] == pytest.approx(want[warmup:31], rel=0, abs=tolerances.lr_schedule_gap(LR))
    assert ours[:warmup] == pytest.approx([LR * (k + 1) / warmup for k in range(warmup)], rel=0,
                                          abs=tolerances.lr_schedule_gap(LR))


@pytest.mark.parametrize("style", ["cosine", "linear", "constant"])
@pytest.mark.parametrize("warmup", [0, 4])
def test_megatron_decay_styles_with_min_lr(style, warmup):
    """Megatron-Core's rate at num_steps = k is the rate of optimizer step k (it sets lr for step 0 when built and
    after each increment); equal from the end of the warm-up, where its ramp starts at init_lr."""
    optimizer = _optimizer()
    theirs = OptimizerParamScheduler(optimizer, init_lr=0.0, max_lr=LR, min_lr=1e-4, lr_warmup_steps=warmup,
                                     lr_decay_steps=25, lr_decay_style=style, start_wd=0.0, end_wd=0.0,
                                     wd_incr_steps=25, wd_incr_style="constant")
    want = []
    for _ in range(STEPS):
        want.append(optimizer.param_groups[0]["lr"])
        theirs.step(1)
    ours = [LR * lr_factor(step, warmup, style, decay_steps=25, min_ratio=1e-4 / LR) for step in range(STEPS)]
    assert ours[warmup:] == pytest.approx(want[warmup:], rel=0, abs=tolerances.lr_schedule_gap(LR))


def test_torch_cosine_annealing_after_a_linear_warm_up():
    """NeMo RL's [LinearLR over W steps, CosineAnnealingLR(T_max, eta_min)] with milestone W, over the T_max steps
    before torch's cosine turns back up."""
    optimizer, warmup, t_max = _optimizer(), 6, 20
    theirs = torch.optim.lr_scheduler.SequentialLR(optimizer, [
        torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / warmup, total_iters=warmup - 1),
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=t_max, eta_min=1e-4)], milestones=[warmup])
    want = _rates(theirs)[:warmup + t_max + 1]
    ours = [LR * lr_factor(step, warmup, "cosine", warmup + t_max, 1e-4 / LR) for step in range(warmup + t_max + 1)]
    # torch's chainable form updates each rate from the previous one: its roundings add up over the steps
    assert ours == pytest.approx(want, rel=0, abs=tolerances.lr_schedule_gap(LR, steps=warmup + t_max + 1))


def test_hand_values():
    assert [lr_factor(k, 2) for k in range(4)] == [0.5, 1.0, 1.0, 1.0]
    # cosine from step 2 to step 6 (p = 0, 1/4, 1/2, 3/4, 1), to a floor of 0.1, then the floor
    half = 0.1 + 0.9 * 0.5
    assert [lr_factor(k, 2, "cosine", 6, 0.1) for k in (2, 4, 6, 9)] == pytest.approx([1.0, half, 0.1, 0.1])
    assert [lr_factor(k, 0, "linear", 4) for k in range(6)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0, 0.0])
