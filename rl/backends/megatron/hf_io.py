"""Whole-checkpoint conversion on one process: HF directory <-> megatron shard files for a TP/PP/EP layout."""

from __future__ import annotations

import json
import os

import torch

from rl.backends.megatron import checkpoint as ckpt
from rl.backends.megatron.convert import hf_to_megatron, megatron_to_hf
from rl.backends.megatron.model import Layout, check_divisible

LAYOUT_FILE = "layout.json"


def hf_to_megatron_checkpoint(hf_path: str, out_dir: str, tp: int, pp: int, ep: int) -> None:
    """Writes one shard per (tp, pp, ep) rank and layout.json (with the source path, for the config)."""
    from transformers import AutoConfig

    from rl.backends.hf_model import load_causal_lm

    config = AutoConfig.from_pretrained(hf_path)
    check_divisible(config, Layout(tp=tp, pp=pp, ep=ep))
    weights = load_causal_lm(hf_path, torch.device("cpu")).state_dict()
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir} already exists; conversions are never overwritten")
    staging = out_dir.rstrip("/") + ".partial"
    for t in range(tp):
        for p in range(pp):
            for e in range(ep):
                layout = Layout(tp=tp, pp=pp, ep=ep, tp_rank=t, pp_rank=p, ep_rank=e)
                ckpt.write_shard(staging, layout, {"model": hf_to_megatron(weights, config, layout)})
    write_layout(staging, Layout(tp=tp, pp=pp, ep=ep), hf_path)
    os.replace(staging, out_dir)


def write_layout(directory: str, layout: Layout, hf_path: str, value_head: bool = False) -> None:
    """layout.json: the sizes the shards were cut for and the HF source (config, tokenizer) for converting back;
    `value_head` marks a critic's shards (`convert.hf_to_megatron`). Model chunks of the interleaved schedule are
    pipeline stages here (PP * VP of them, `Layout.chunk`)."""
    info = {"tp": layout.tp, "pp": layout.pp * layout.vp, "ep": layout.ep, "hf_path": os.path.abspath(hf_path)}
    if value_head:
        info["value_head"] = True
    with open(os.path.join(directory, LAYOUT_FILE), "w") as f:
        json.dump(info, f)


def read_layout(megatron_dir: str) -> dict:
    path = os.path.join(megatron_dir, LAYOUT_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: not a checkpoint written by rl.launch.convert")
    with open(path) as f:
        return json.load(f)


def megatron_checkpoint_to_hf(megatron_dir: str, out_dir: str, hf_config_path: str | None = None) -> None:
    """Merges every shard back into Hugging Face safetensors (config and tokenizer from `hf_config_path`, default
    the source recorded at conversion); a critic's as a one-label token classifier."""
    from rl.backends.hf_model import save_hf_checkpoint

    info = read_layout(megatron_dir)
    source = hf_config_path or info["hf_path"]
    save_hf_checkpoint(source, megatron_weights(megatron_dir, source), out_dir, critic=info.get("value_head", False))


def megatron_weights(megatron_dir: str, hf_config_path: str) -> dict[str, torch.Tensor]:
    """Every shard's model state merged under Hugging Face names (a critic's value head as `lm_head.weight`,
    `lm_head.bias`); a LoRA checkpoint's adapters merged into the base model at `hf_config_path`."""
    from transformers import AutoConfig

    from rl.backends.lora import read_scaling, with_base
    from rl.backends.megatron.lora import to_hf

    info = read_layout(megatron_dir)
    config = AutoConfig.from_pretrained(hf_config_path)
    shards = {}
    for t in range(info["tp"]):
        for p in range(info["pp"]):
            for e in range(info["ep"]):
                layout = Layout(tp=info["tp"], pp=info["pp"], ep=info["ep"], tp_rank=t, pp_rank=p, ep_rank=e)
                shards[(t, p, e)] = ckpt.read_shard(megatron_dir, layout)["model"]
    if read_scaling(megatron_dir) is not None:  # adapters only
        return with_base(megatron_dir, hf_config_path, dict(to_hf(shards, config, info["tp"], info["pp"])))
    return megatron_to_hf(shards, config, info["tp"], info["pp"], info["ep"], info.get("value_head", False))
