"""LoRA adapters on a Hugging Face model (`trainer.policy.model.lora`), through PEFT's injection into the model in
place (transformers' `add_adapter`), so the model keeps its class, its forward and its LM head: each targeted
linear layer becomes `<name>.base_layer` (frozen) plus `<name>.lora_A.default` / `<name>.lora_B.default`.

The rest of the system sees Hugging Face names: `merged_items` turns a stream of (name, tensor) in the adapted
model's naming into the base model's names with W + (alpha / rank) B A in place of each adapted weight (what the
engines and full exports take); `adapter_items` keeps only the adapters, under PEFT's file names, for an adapter
folder `peft.PeftModel.from_pretrained` loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor, nn

ADAPTER = "default"
BASE_LAYER = ".base_layer."
_A, _B, _BASE = f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight", BASE_LAYER
ALL_LINEAR = "all-linear"


def peft_config(options: dict, model_path: str | None = None, frozen_prefix: str | None = None):
    """PEFT's config for `options` (trainer.*.model.lora); `frozen_prefix`: a submodule no adapter goes in (a
    vision-language model's vision tower), beside the user's exclude_modules."""
    from peft import LoraConfig

    targets, excluded = options["target_modules"], options.get("exclude_modules")
    if frozen_prefix:  # one pattern (PEFT full-matches a string) for both: the prefix, and each excluded name
        names = "|".join(re.escape(name) for name in excluded or [])
        excluded = rf"{re.escape(frozen_prefix)}\..*" + (rf"|(.*\.)?({names})" if names else "")
    return LoraConfig(
        r=options["rank"], lora_alpha=options["alpha"], lora_dropout=options["dropout"],
        target_modules=ALL_LINEAR if targets == [ALL_LINEAR] else list(targets),
        exclude_modules=excluded,
        init_lora_weights=True if options["init_method"] == "kaiming" else "gaussian",
        task_type="CAUSAL_LM", base_model_name_or_path=model_path,
    )


def linear_names(model: nn.Module) -> set[str]:
    """The last name part of every linear layer but the LM head (what target_modules may name)."""
    head = model.get_output_embeddings()
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and module is not head}


def add_lora(model: nn.Module, options: dict, model_path: str, critic: bool = False) -> None:
    """Adapters on `model` in place; only they (and a critic's value head) require grad afterwards. A target name
    the model lacks is refused."""
    targets = options["target_modules"]
    if targets != [ALL_LINEAR]:
        missing = sorted(set(targets) - linear_names(model))
        if missing:
            raise ValueError(f"trainer.{'critic' if critic else 'policy'}.model.lora.target_modules: "
                             f"{type(model).__name__} has no linear layer "
                             f"named {', '.join(missing)}; its linear layers: {', '.join(sorted(linear_names(model)))}"
                             f" (or [{ALL_LINEAR}])")
    from rl.backends.multimodal import VISION_TOWER, takes_images

    frozen = VISION_TOWER if takes_images(model) else None  # adapters on the language layers only
    model.add_adapter(peft_config(options, model_path, frozen), adapter_name=ADAPTER)
    if critic:
        model.get_output_embeddings().requires_grad_(True)


def is_adapter(name: str) -> bool:
    return name.endswith((_A, _B))


def trains_with_adapters(name: str, critic: bool) -> bool:
    """Whether a LoRA model trains the parameter `name`: its adapters, and a critic's value head (a new layer,
    trained whole as PEFT's `modules_to_save` would)."""
    from rl.backends.value_head import OWN_HEAD

    return is_adapter(name) or (critic and name.startswith(OWN_HEAD + "."))


def scaling(options: dict) -> float:
    return float(options["alpha"]) / int(options["rank"])


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """The base model: adapters off for the block (the reference model of a LoRA run)."""
    model.disable_adapters()
    try:
        yield
    finally:
        model.enable_adapters()


def merged_items(items: Iterable[tuple[str, Tensor]], scale: float) -> Iterator[tuple[str, Tensor]]:
    """The base model's (name, tensor) with each adapted weight merged, W + scale * B @ A (in W's dtype, computed
    in fp32), from the adapted model's items in state-dict order (a layer's base weight, then A, then B)."""
    pending: dict[str, dict[str, Tensor]] = {}
    for name, tensor in items:
        for suffix, part in ((_A, "A"), (_B, "B"), (_BASE + "weight", "W")):
            if name.endswith(suffix):
                prefix = name[: -len(suffix)]
                parts = pending.setdefault(prefix, {})
                parts[part] = tensor
                if len(parts) == 3:
                    del pending[prefix]
                    delta = parts["B"].float() @ parts["A"].float()
                    yield prefix + ".weight", (parts["W"].float() + scale * delta).to(parts["W"].dtype)
                break
        else:
            yield name.replace(_BASE, "."), tensor
    if pending:
        raise RuntimeError(f"LoRA layers without all of base weight, A and B in the stream: {sorted(pending)}")


def adapter_items(items: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
    """The adapters only, under PEFT's adapter-file names (`base_model.model.<name>.lora_A.weight`)."""
    for name, tensor in items:
        if is_adapter(name):
            yield "base_model.model." + name.replace(f".{ADAPTER}.weight", ".weight"), tensor


CONFIG_FILE = "adapter_config.json"


def write_adapter_config(directory: str, options: dict, model_path: str) -> None:
    """PEFT's own adapter_config.json, with the adapters where `add_lora` put them."""
    from transformers import AutoConfig

    from rl.backends.multimodal import VISION_TOWER
    from rl.core.model_class import is_vision_language

    frozen = VISION_TOWER if is_vision_language(AutoConfig.from_pretrained(model_path)) else None
    peft_config(options, model_path, frozen).save_pretrained(directory)


def read_scaling(directory: str) -> float | None:
    """alpha / rank of the adapters a checkpoint or adapter folder holds (None: it holds none)."""
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        config = json.load(f)
    return float(config["lora_alpha"]) / int(config["r"])


def merge_into(base: dict[str, Tensor], adapters: dict[str, Tensor], scale: float) -> dict[str, Tensor]:
    """The base model's weights (HF names) with adapters in the model's own naming merged in."""
    merged = dict(base)
    for name in adapters:
        if name.endswith(_A):
            layer = name[: -len(_A)]
            a, b = adapters[name].float(), adapters[layer + _B].float()
            weight = merged[layer + ".weight"]
            merged[layer + ".weight"] = (weight.float() + scale * (b @ a)).to(weight.dtype)
    return merged


def with_base(path: str, model_path: str, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """A checkpoint's weights as a whole model: a LoRA checkpoint (it holds adapters, and a critic's its value
    head) merged into the base the run started from; any other as it is."""
    scale = read_scaling(path)
    if scale is None:
        return weights
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(os.path.expanduser(model_path), dtype=torch.float32)
    merged = merge_into(base.state_dict(), {name: value for name, value in weights.items() if is_adapter(name)},
                        scale)
    merged.update({name: value for name, value in weights.items() if not is_adapter(name)})  # a value head
    return merged


def save_adapter(directory: str, adapters: dict[str, Tensor], options: dict, model_path: str) -> None:
    """A PEFT adapter folder: adapter_config.json and adapter_model.safetensors."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    write_adapter_config(directory, options, model_path)
    save_file({name: t.contiguous() for name, t in adapters.items()},
              os.path.join(directory, "adapter_model.safetensors"))

