"""megatron-core's data-parallel training machinery for the policy: DDP grad buffers, `finalize_model_grads`,
megatron's optimizer with its grad norm and clipping, and the base class's LR warm-up over it.

Backward accumulates gradients into megatron's contiguous fp32 DDP buffers (`param.main_grad`); nothing is reduced
until `reduce_and_clip`, so micro-batches accumulate for free. Then `finalize_model_grads` reduces over DP (and sums
SP norm gradients over TP and tied embeddings over the first and last stage), megatron's optimizer takes the grads
(`prepare_grads`), computes the global norm and clips by it, and `step` applies the update.

- Default: `get_megatron_optimizer(use_distributed_optimizer=True)`: DistributedOptimizers (ZeRO-1: dense parameters
  sharded over the DP group, experts over the expert-DP group) around torch's AdamW (megatron-core's fallback without
  Transformer Engine / Apex); the grads are reduce-scattered and the new weights all-gathered after the update.
- `optimizer_cpu_offload`: megatron's `HybridDeviceOptimizer` fails in 0.16.1 for these fp32 models: built inside the
  distributed optimizer it is handed non-leaf fp32 shard views (torch: "can't optimize a non-leaf Tensor", on any
  device); without it, it offloads only CUDA tensors, so on CPU its step fails (KeyError in its host-copy map). So
  megatron's non-distributed optimizer (all-reduced grads) prepares, norms and clips the grads and `HostAdamW` (fp32
  masters and moments in host memory) applies the update; the torch AdamW inside megatron's optimizer only lists the
  parameters and never steps, so it holds no state.
"""

from __future__ import annotations

import torch

from rl.backends.base import ModelSpec, lr_schedule
from rl.backends.host_optimizer import HostAdamW
from rl.backends.megatron import checkpoint as ckpt


def wrap_ddp(model, distributed_optimizer: bool):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=distributed_optimizer,
                                               grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               overlap_param_gather=False)
    return DistributedDataParallel(model.config, ddp_config, model)


def _megatron_optimizer(ddp_chunks: list, spec: ModelSpec):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    distributed = ddp_chunks[0].ddp_config.use_distributed_optimizer
    config = OptimizerConfig(optimizer="adam", lr=spec.lr, min_lr=spec.lr, weight_decay=spec.weight_decay,
                             adam_beta1=spec.betas[0], adam_beta2=spec.betas[1], adam_eps=1e-8,
                             clip_grad=spec.max_grad_norm, use_distributed_optimizer=distributed)
    # config_overrides={}: weight decay on every parameter, as torch's AdamW in the other backends (megatron's
    # default skips biases and norms).
    return get_megatron_optimizer(config, ddp_chunks, config_overrides={})


class ScheduledLR:
    """Every strategy's schedule (`base.lr_schedule`) over several torch optimizers, stepped together (a LambdaLR
    needs one torch optimizer)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer], spec: ModelSpec):
        self.schedulers = [lr_schedule(opt, spec) for opt in optimizers]

    @property
    def steps(self) -> int:
        return self.schedulers[0].last_epoch if self.schedulers else 0

    def step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()

    def state_dict(self) -> list[dict]:
        return [scheduler.state_dict() for scheduler in self.schedulers]

    def load_state_dict(self, states: list[dict]) -> None:
        for scheduler, state in zip(self.schedulers, states, strict=True):
            scheduler.load_state_dict(state)


class MegatronAdam:
    """AdamW over a megatron DDP-wrapped model, one DDP module per model chunk (several with the interleaved
    schedule; see the module docstring). Call its methods inside `cpu_compat`."""

    def __init__(self, ddp_chunks: list, spec: ModelSpec, offload: bool):
        self.ddp = ddp_chunks
        self.megatron = _megatron_optimizer(ddp_chunks, spec)
        self.host = None
        if offload:
            trained = [p for chunk in ddp_chunks for p in chunk.module.parameters() if p.requires_grad]
            self.host = HostAdamW(trained, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay)
        self.scheduler = ScheduledLR(self.torch_optimizers(), spec)

    def torch_optimizers(self) -> list[torch.optim.Optimizer]:
        """The torch optimizers that apply the update (none on a rank without such parameters)."""
        if self.host is not None:
            return [self.host]
        return [opt.optimizer for opt in self.megatron.chained_optimizers if opt.optimizer is not None]

    @property
    def lr(self) -> float:
        return self.torch_optimizers()[0].param_groups[0]["lr"]

    def reduce_and_clip(self, max_norm: float) -> float:
        """Reduces the accumulated grads, hands them to the optimizer, returns megatron's global grad norm and clips
        by it (ChainedOptimizer.step's first half, split off so the grads can be looked at before the update)."""
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer import optimizer as megatron_optimizer

        finalize_model_grads(self.ddp)
        self.megatron.prepare_grads()
        norm = float(self.megatron.get_grad_norm())
        for opt in self.megatron.chained_optimizers:
            params = opt.get_parameters()
            if max_norm > 0 and params:
                megatron_optimizer.clip_grad_by_total_norm_fp32(params, max_norm, norm)
        return norm

    def drop_grads(self) -> None:
        """Fresh grad buffers without an update (a step skipped for a non-finite gradient norm)."""
        for chunk in self.ddp:
            chunk.zero_grad_buffer()
        self.megatron.zero_grad()
        if self.host is not None:
            self.host.zero_grad()

    def step(self) -> None:
        """The update (then, with the distributed optimizer, the all-gather of the new weights over DP), the LR
        schedule's step, and fresh grad buffers."""
        if self.host is not None:
            self.host.step()
        else:
            self.megatron.step_with_ready_grads()
        self.scheduler.step()
        for chunk in self.ddp:
            chunk.zero_grad_buffer()
        self.megatron.zero_grad()
        if self.host is not None:
            self.host.zero_grad()

    def state_dict(self) -> dict:
        """{"scheduler", "optimizer"} for the checkpoint (collective). Before the first step there is no optimizer
        state to keep (megatron reads the step from it), so only the schedule is saved."""
        state = {"scheduler": self.scheduler.state_dict()}
        if self.scheduler.steps:
            state["optimizer"] = (self.host.state_dict() if self.host is not None
                                  else ckpt.distributed_optimizer_state(self.megatron))
        return state

    def load_state_dict(self, state: dict) -> None:
        """Undoes `state_dict` (collective), after the weights were loaded. Without "optimizer" (weights only, or
        saved before a step) the optimizer starts fresh: the distributed optimizer's fp32 main params are views of the
        weights already, HostAdamW's host masters are copied from them."""
        if "optimizer" in state:
            if self.host is not None:
                self.host.load_state_dict(state["optimizer"])
            else:
                ckpt.load_distributed_optimizer_state(self.megatron, state["optimizer"])
        elif self.host is not None:
            self.host.resync_masters()
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])

    def move_state(self, device: torch.device) -> None:
        """Moves the device-side optimizer state (the distributed optimizer's AdamW moments) to `device`."""
        if self.host is not None:
            return  # host state by design
        for opt in self.torch_optimizers():
            for state in opt.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and key != "step":  # AdamW keeps "step" on the host
                        state[key] = value.to(device, non_blocking=True)
