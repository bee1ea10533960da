"""Copying named tensors into a model by Hugging Face parameter name (weight sync after a training step)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import torch


def _targets(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name, tied aliases included (e.g. both `lm_head.weight` and the embedding)."""
    targets: dict[str, torch.Tensor] = dict(model.named_buffers(remove_duplicate=False))
    targets.update(model.named_parameters(remove_duplicate=False))
    return targets


def _unknown_message(unknown: list[str], known: Iterable[str]) -> str:
    known = list(known)
    hints = []
    for name in unknown[:5]:
        close = difflib.get_close_matches(name, known, n=1)
        if close:
            hints.append(f"'{name}' -> did you mean '{close[0]}'?")
    hint = f" ({'; '.join(hints)})" if hints else ""
    return (
        f"update_weights got {len(unknown)} name(s) the model does not have: {unknown}{hint}. Send Hugging Face "
        "parameter names as in model.state_dict() (e.g. 'model.embed_tokens.weight'), without wrapper prefixes."
    )


def copy_named_tensors(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy each (name, tensor) into the model's parameter or buffer of that name; returns how many were copied.

    Like `load_state_dict(strict=False)`, names may cover only part of the model; unlike it, a name the model lacks,
    a shape that differs, or two different values sent for the same tied tensor raise ValueError listing every
    offender. Tensors are streamed: known names are copied as they arrive, and the error comes once the input ends.
    dtype and device are converted to the model's.
    """
    targets = _targets(model)
    unknown: list[str] = []
    problems: list[str] = []
    first_name: dict[int, str] = {}
    copied = 0
    with torch.no_grad():
        for name, tensor in named_tensors:
            target = targets.get(name)
            if target is None:
                unknown.append(name)
                continue
            if tuple(target.shape) != tuple(tensor.shape):
                problems.append(f"'{name}' has shape {tuple(tensor.shape)}, the model's is {tuple(target.shape)}")
                continue
            alias = first_name.setdefault(id(target), name)
            if alias != name and not torch.equal(target, tensor.to(target.device, target.dtype)):
                problems.append(f"'{name}' is tied to '{alias}' in the model but was sent a different value")
                continue
            target.copy_(tensor)
            copied += 1
    if unknown:
        problems.insert(0, _unknown_message(unknown, targets))
    if problems:
        raise ValueError("; ".join(problems))
    return copied


def check_named_shapes(known: dict[str, tuple[int, ...]], named_shapes: Iterable[tuple[str, tuple[int, ...]]]) -> None:
    """ValueError naming every name `known` lacks (with a did-you-mean) and every shape that differs from its
    entry; for engines whose model does not hold Hugging Face names itself (vLLM fuses projections)."""
    unknown, problems = [], []
    for name, shape in named_shapes:
        if name not in known:
            unknown.append(name)
        elif tuple(known[name]) != tuple(shape):
            problems.append(f"'{name}' has shape {tuple(shape)}, the model's is {tuple(known[name])}")
    if unknown:
        problems.insert(0, _unknown_message(unknown, known))
    if problems:
        raise ValueError("; ".join(problems))


def model_shapes(directory: str) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """(every state_dict name and shape, each tied alias by the name it shares a tensor with) of the transformers
    model a checkpoint directory builds, made on the meta device (no memory): the names a trainer sends, which the
    checkpoint's files may spell otherwise (transformers renames Qwen2-VL's stored `visual.*` to `model.visual.*`
    as it loads)."""
    from transformers import AutoConfig

    from rl.core.model_class import generative_class

    config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        model = generative_class(config).from_config(config)
    first: dict[int, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(param), name) != name:
            aliases[first[id(param)]] = name
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}, aliases
