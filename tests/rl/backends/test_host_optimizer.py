"""HostAdamW (optimizer CPU offload) against torch's AdamW: the same updates step by step, with the LR schedule,
zero_grad and a state-dict round trip into a fresh optimizer whose masters follow the restored weights."""

import copy

import torch
from torch import nn

from rl.backends.host_optimizer import HostAdamW
from tests.testing import tolerances

SETTINGS = {"lr": 1e-2, "betas": (0.9, 0.98), "weight_decay": 0.01}


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    model[0].bias.requires_grad_(False)  # frozen parameters stay out of the optimizer
    return model


def _schedule(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))


def _train(model, optimizer, scheduler, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(5, 6, generator=generator)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in model.parameters())


def _assert_same_weights(got: nn.Module, want: nn.Module, steps: int) -> None:
    """Within `tolerances.adam_bulk_gap`: the two optimizers' update arithmetic and weight writes round differently,
    and the gradients then differ by the rounding of this network's sums (inputs 6, hidden 8, outputs 3, a batch
    of 5, forward and backward)."""
    grad_rtol = tolerances.network_rtol([6, 8, 3, 5, 5], torch.float32)
    for (name, a), (_, b) in zip(got.named_parameters(), want.named_parameters(), strict=True):
        bound = tolerances.adam_bulk_gap(b, SETTINGS["lr"], steps, grad_rtol, torch.float32, SETTINGS["betas"])
        tolerances.assert_within(a, b, bound, msg=name)


def test_updates_equal_torch_adamw():
    plain, offloaded = _model(), _model()
    frozen_before = offloaded[0].bias.detach().clone()
    opt_plain = torch.optim.AdamW([p for p in plain.parameters() if p.requires_grad], **SETTINGS)
    opt_host = HostAdamW(offloaded.parameters(), **SETTINGS)
    _train(plain, opt_plain, _schedule(opt_plain), 5, seed=1)
    _train(offloaded, opt_host, _schedule(opt_host), 5, seed=1)
    _assert_same_weights(offloaded, plain, steps=5)
    assert torch.equal(offloaded[0].bias, frozen_before)
    assert len(opt_host.masters) == 3 and all(m.device.type == "cpu" for m in opt_host.masters)
    for state in opt_host.state.values():
        assert state["exp_avg"].device.type == "cpu" and state["exp_avg"].dtype == torch.float32


def test_state_dict_round_trip_resumes_exactly():
    uninterrupted = _model()
    opt = HostAdamW(uninterrupted.parameters(), **SETTINGS)
    sched = _schedule(opt)
    _train(uninterrupted, opt, sched, 3, seed=2)
    saved_model, saved_opt, saved_sched = (copy.deepcopy(uninterrupted.state_dict()), copy.deepcopy(opt.state_dict()),
                                           sched.state_dict())
    _train(uninterrupted, opt, sched, 3, seed=3)

    resumed = _model()  # fresh weights: the masters must follow the restored ones, not these
    opt2 = HostAdamW(resumed.parameters(), **SETTINGS)
    sched2 = _schedule(opt2)
    resumed.load_state_dict(saved_model)
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(saved_sched)
    _train(resumed, opt2, sched2, 3, seed=3)
    for (name, a), (_, b) in zip(resumed.named_parameters(), uninterrupted.named_parameters(), strict=True):
        assert torch.equal(a, b), f"{name}: the same code from the same state, bit for bit"
