"""NeMo RL's optimizer and learning-rate schedule: `policy.megatron_cfg.optimizer` / `scheduler` with megatron,
`policy.optimizer` / `policy.scheduler` (torch's classes) with the DTensor backend."""

from __future__ import annotations

from typing import Any

from rl.core.config.dialects.apply import take_all
from rl.core.config.dialects.layer import MISSING, Layer
from rl.core.config.dialects.nemo import MC, P
from rl.core.config.dialects.nemo_rules import OPTIMIZER, emit, inert, megatron_selected, strategy_keys


def optimizer(layer: Layer) -> None:
    """NeMo RL trains megatron with `policy.megatron_cfg.optimizer` / `scheduler` and the DTensor backend with
    `policy.optimizer` / `policy.scheduler`; the other pair is ignored, as there."""
    torch_keys = {key: layer.take(key) for key in [*layer.names(P + "optimizer"), *layer.names(P + "scheduler")]}
    if megatron_selected(layer):
        inert(layer, torch_keys, "the Megatron backend trains with policy.megatron_cfg.optimizer and scheduler")
    else:
        _torch_optimizer(layer, torch_keys)
    _megatron_optimizer(layer)


def _torch_optimizer(layer: Layer, keys: dict[str, Any]) -> None:
    kwargs = P + "optimizer.kwargs."
    for key, value in keys.items():
        name = key.removeprefix(kwargs)
        if key == P + "optimizer" and value is None:
            layer.inert(key, "no DTensor optimizer given")
        elif key == P + "optimizer.name":
            if value not in ("torch.optim.AdamW", "AdamW"):
                layer.refuse(key, f"is {value!r}; the optimizer here is AdamW (torch.optim.AdamW)")
            else:
                layer.inert(key, "AdamW, as here")
        elif key.startswith(kwargs) and name in ("lr", "weight_decay", "betas"):
            emit(layer, key, OPTIMIZER + name, value, at=key)
        elif key.startswith(kwargs) and name == "eps":
            _eps(layer, key, value)
        elif key.startswith(kwargs) and name in ("foreach", "fused"):
            layer.inert(key, "changes speed only")
        elif key == P + "scheduler":
            _scheduler_list(layer, key, value)
        else:
            layer.refuse(
                key,
                "is an optimizer or scheduler argument with no counterpart here; remove it "
                f"({OPTIMIZER}* lists the optimizer's keys)",
            )


def _eps(layer: Layer, key: str, value: Any) -> None:
    try:
        ok = float(value) == 1e-8
    except (TypeError, ValueError):
        ok = False
    if ok:
        layer.inert(key, "AdamW's epsilon is 1e-8 here")
    else:
        layer.refuse(key, f"is {value!r}; AdamW's epsilon is fixed at 1e-8 here; set it to 1e-8")


def _scheduler_list(layer: Layer, key: str, value: Any) -> None:
    """NeMo RL's scheduler list: [LinearLR warm-up from start_factor to 1 over W steps, ConstantLR, milestones [W]]
    is our linear warm-up over W steps; a ConstantLR alone is no warm-up."""
    if value is None:
        layer.inert(key, "no schedule: a constant learning rate")
        return
    steps = [entry for entry in value if isinstance(entry, dict) and "name" in entry] if isinstance(value, list) else []
    names = [entry["name"].rsplit(".", 1)[-1] for entry in steps]
    kwargs = [entry.get("kwargs") or {} for entry in steps]
    if names == ["ConstantLR"] and kwargs[0].get("factor", 1.0) == 1.0:
        emit(layer, key, OPTIMIZER + "lr_warmup_steps", 0)
        return
    if names and names[-1] == "CosineAnnealingLR" and _cosine_after_warmup(layer, key, names, kwargs):
        return
    rest = zip(names[1:], kwargs[1:], strict=True)
    if (
        names
        and names[0] == "LinearLR"
        and kwargs[0].get("end_factor", 1.0) == 1.0
        and all(name == "ConstantLR" and args.get("factor", 1.0) == 1.0 for name, args in rest)
    ):
        warmup, start = int(kwargs[0].get("total_iters", 0)), float(kwargs[0].get("start_factor", 1.0 / 3))
        emit(
            layer,
            key,
            OPTIMIZER + "lr_warmup_steps",
            warmup,
            note=f"the warm-up is linear from lr / {warmup} at the first optimizer step to lr at step {warmup} "
            f"(NeMo RL's LinearLR starts at {start:g} x lr)",
        )
        return
    layer.refuse(
        key,
        f"is {value!r}: the schedules here are a linear warm-up (LinearLR to factor 1), then a constant rate "
        f"(ConstantLR of factor 1) or a cosine decay (CosineAnnealingLR): {OPTIMIZER}lr_warmup_steps, scheduler, "
        "min_lr, lr_decay_steps",
    )


def _cosine_after_warmup(layer: Layer, key: str, names: list[str], kwargs: list[dict]) -> bool:
    """[CosineAnnealingLR] or [LinearLR to factor 1 over W steps, CosineAnnealingLR] (SequentialLR, milestone W):
    our cosine decay from lr to eta_min over T_max steps after the warm-up."""
    if len(names) > 2 or (len(names) == 2 and (names[0] != "LinearLR" or kwargs[0].get("end_factor", 1.0) != 1.0)):
        return False
    warmup = int(kwargs[0].get("total_iters", 5)) if len(names) == 2 else 0
    cosine = kwargs[-1]
    if "T_max" not in cosine:
        return False
    emit(layer, key, OPTIMIZER + "scheduler", "cosine",
         note=f"the rate stays at eta_min after T_max={cosine['T_max']} steps of decay (torch's CosineAnnealingLR "
         "rises again)" + (f"; the warm-up is linear from lr / {warmup} at the first optimizer step" if warmup else ""))
    layer.emit(OPTIMIZER + "lr_warmup_steps", warmup, at=key)
    layer.emit(OPTIMIZER + "lr_decay_steps", warmup + int(cosine["T_max"]), at=key)
    layer.emit(OPTIMIZER + "min_lr", float(cosine.get("eta_min", 0.0)), at=key)
    return True


def _megatron_optimizer(layer: Layer) -> None:
    own = strategy_keys()
    keys = {key: layer.take(key) for key in layer.names(MC + "optimizer") if key not in own}
    schedule = take_all(layer, MC + "scheduler")
    opt, sch = MC + "optimizer.", MC + "scheduler."
    betas = [keys.pop(opt + "adam_beta1", MISSING), keys.pop(opt + "adam_beta2", MISSING)]
    if any(beta is not MISSING for beta in betas):
        current = layer.current(OPTIMIZER + "betas")
        value = [beta if beta is not MISSING else current[index] for index, beta in enumerate(betas)]
        emit(layer, opt + "adam_beta1/adam_beta2", OPTIMIZER + "betas", value, at=opt + "adam_beta1")
    targets = {
        "lr": OPTIMIZER + "lr",
        "weight_decay": OPTIMIZER + "weight_decay",
        "clip_grad": OPTIMIZER + "max_grad_norm",
    }
    fixed = {"optimizer": ("adam",), "fp16": (False,), "params_dtype": ("float32", "fp32")}
    for key, value in keys.items():
        name = key.removeprefix(opt)
        if name in targets:
            emit(layer, key, targets[name], value, at=key)
        elif name in fixed:
            (
                layer.inert(key, "as here")
                if value in fixed[name]
                else layer.refuse(key, f"is {value!r}; the optimizer here is AdamW with float32 master weights")
            )
        elif name == "adam_eps":
            _eps(layer, key, value)
        elif name == "bf16":
            layer.inert(key, "bf16 training follows policy.precision (trainer.bf16)")
        elif name == "sgd_momentum":
            layer.inert(key, "used only with SGD")
        elif name == "min_lr":
            _min_lr(layer, key, value, schedule.get(sch + "lr_decay_style", "constant"))
        elif name in ("use_distributed_optimizer", "use_precision_aware_optimizer", "overlap_cpu_optimizer_d2h_h2d"):
            layer.inert(key, "optimizer-state placement: changes speed or memory only")
        elif name == "optimizer_offload_fraction" and value in (0, 0.0, 1, 1.0):
            layer.inert(key, "all or nothing, as optimizer_cpu_offload does here")
        else:
            layer.refuse(key, "is a Megatron-Core optimizer argument with no counterpart here; remove it")
    _megatron_schedule(layer, schedule, keys.get(opt + "weight_decay", layer.current(OPTIMIZER + "weight_decay")), sch)


DECAY_STYLES = ("constant", "cosine", "linear")
"""Megatron-Core's `lr_decay_style`s that are our schedulers of the same names."""


def _min_lr(layer: Layer, key: str, value: Any, style: Any) -> None:
    if style in DECAY_STYLES[1:]:
        emit(layer, key, OPTIMIZER + "min_lr", value, at=key)
    else:
        layer.inert(key, "used only with a decaying learning rate (lr_decay_style cosine or linear)")


def _megatron_schedule(layer: Layer, keys: dict[str, Any], weight_decay: Any, sch: str) -> None:
    for key, value in keys.items():
        name = key.removeprefix(sch)
        if name == "lr_warmup_iters":
            start = keys.get(sch + "lr_warmup_init", 0.0)
            note = (
                f"the warm-up starts at lr / {value} here (NeMo RL's at lr_warmup_init={start:g})"
                if value and start
                else ""
            )
            emit(layer, key, OPTIMIZER + "lr_warmup_steps", value, at=key, note=note)
        elif name == "lr_warmup_init":
            layer.inert(key, "the warm-up starts at lr / lr_warmup_iters here")
        elif name == "lr_decay_style":
            if value in DECAY_STYLES:
                emit(layer, key, OPTIMIZER + "scheduler", value, at=key)
            else:
                layer.refuse(key, f"is {value!r}: the decays here are {', '.join(DECAY_STYLES[1:])} "
                                  f"({OPTIMIZER}scheduler)")
        elif name == "weight_decay_incr_style":
            (
                layer.inert(key, "constant, as here")
                if value == "constant"
                else layer.refuse(key, f"is {value!r}: a weight-decay schedule is not available here")
            )
        elif name == "lr_decay_iters":
            if keys.get(sch + "lr_decay_style", "constant") in DECAY_STYLES[1:] and value is not None:
                emit(layer, key, OPTIMIZER + "lr_decay_steps", value, at=key)
            else:
                layer.inert(key, "used only with a decaying learning rate" if value is not None else "the run's last "
                            "optimizer step, as here")
        elif name in ("start_weight_decay", "end_weight_decay"):
            (
                layer.inert(key, "the constant weight decay, as here")
                if value == weight_decay
                else layer.refuse(
                    key,
                    f"is {value!r}, not the weight decay {weight_decay!r}: a weight-decay schedule is not "
                    "available here",
                )
            )
        else:
            layer.refuse(key, "is a Megatron-Core scheduler argument with no counterpart here; remove it")
