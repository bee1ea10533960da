"""AdamW that keeps its fp32 master weights and moment estimates in host memory (optimizer CPU offload).

The device holds only the model's weights and gradients: each step copies the gradients to the host, runs AdamW
there on fp32 master copies, and copies the new weights back. Optimizer memory on the device drops from two or three
extra copies of the weights to none, at the price of a host round trip per step (what Megatron's
`optimizer_cpu_offload` and DeepSpeed's `offload_optimizer` trade). On a CPU run the copies are host-to-host and the
update equals a plain AdamW's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

HOST = torch.device("cpu")


class HostAdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` over host fp32 masters of `params`; `step` writes the result into `params`."""

    def __init__(self, params, **adamw_kwargs):
        self.device_params: list[nn.Parameter] = [p for p in params if p.requires_grad]
        pin = torch.cuda.is_available() and any(p.is_cuda for p in self.device_params)
        self.masters = [_host_copy(p, pin).requires_grad_(True) for p in self.device_params]
        super().__init__(self.masters, **adamw_kwargs)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("HostAdamW.step takes no closure: gradients come from the device parameters")
        for master, param in zip(self.masters, self.device_params, strict=True):
            master.grad = None if param.grad is None else param.grad.detach().to(HOST, torch.float32)
        super().step()
        for master, param in zip(self.masters, self.device_params, strict=True):
            param.copy_(master, non_blocking=True)
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for param in self.device_params:
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()

    @torch.no_grad()
    def resync_masters(self) -> None:
        """Take the masters from the device weights (after the model's weights were loaded from a checkpoint)."""
        for master, param in zip(self.masters, self.device_params, strict=True):
            master.copy_(param.detach().to(HOST, torch.float32))

    def load_state_dict(self, state_dict: dict) -> None:
        """Moment estimates from `state_dict` (they land beside the host masters); the masters from the device
        weights, which the caller restored first."""
        super().load_state_dict(state_dict)
        self.resync_masters()


def _host_copy(param: Tensor, pin: bool) -> Tensor:
    copy = param.detach().to(HOST, torch.float32, copy=True)
    return copy.pin_memory() if pin else copy
