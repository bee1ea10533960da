"""Hugging Face <-> megatron-core weights, for one rank of a TP/PP/EP layout or all of them.

HF names are those of the in-memory transformers model (`model.state_dict()`; Mixtral experts fused as
`mlp.experts.gate_up_proj [E, 2I, H]` / `down_proj [E, H, I]`). Megatron names are the local GPTModel's.
- Column-parallel weights (rows split over TP): fused QKV, fc1, embedding and output layer (vocab padded to a
  multiple of TP with zero rows). Row-parallel (columns split): linear_proj, fc2.
- Fused QKV is laid out by query group: [q heads of group 0, k_0, v_0, q heads of group 1, ...]; TP takes a
  contiguous run of groups. fc1 is [gate shard; up shard] on each TP rank.
- PP: stage p holds global layers p * L/PP ... (p + 1) * L/PP - 1 as local 0 ...; embedding on the first stage,
  final norm and output layer on the last (tied models keep an output copy there when PP > 1).
- EP: rank e holds experts e * E/EP ... as local_experts.0 ...; experts are TP-split like dense MLPs (ETP = TP).
- A critic (`value_head`): the output layer is the value head (`lm_head.weight [1, H]`, `lm_head.bias [1]` in HF
  naming, `rl.backends.value_head`), whole on every TP rank of the last stage (`critic.ValueHead`).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from rl.backends.megatron.model import Layout, head_dim, padded_vocab_size

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")


def _shard(t: Tensor, dim: int, parts: int, index: int) -> Tensor:
    return t.chunk(parts, dim=dim)[index].clone()


def _qkv_groups(cfg) -> tuple[int, int, int]:
    return cfg.num_key_value_heads, cfg.num_attention_heads // cfg.num_key_value_heads, head_dim(cfg)


def fuse_qkv(q: Tensor, k: Tensor, v: Tensor, cfg, tp: int, tp_rank: int) -> Tensor:
    groups, per_group, d = _qkv_groups(cfg)
    tail = q.shape[1:]
    fused = torch.cat([q.reshape(groups, per_group * d, *tail), k.reshape(groups, d, *tail),
                       v.reshape(groups, d, *tail)], dim=1)
    return _shard(fused, 0, tp, tp_rank).reshape(-1, *tail)


def split_qkv(shards: list[Tensor], cfg) -> tuple[Tensor, Tensor, Tensor]:
    groups, per_group, d = _qkv_groups(cfg)
    tail = shards[0].shape[1:]
    fused = torch.cat(shards, dim=0).reshape(groups, (per_group + 2) * d, *tail)
    q, k, v = fused.split([per_group * d, d, d], dim=1)
    return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)


def _pad_vocab(weight: Tensor, cfg, tp: int) -> Tensor:
    extra = padded_vocab_size(cfg.vocab_size, tp) - weight.shape[0]
    return torch.cat([weight, weight.new_zeros(extra, *weight.shape[1:])]) if extra else weight


def _layer_to_megatron(hf: dict[str, Tensor], cfg, g: int, layout: Layout) -> dict[str, Tensor]:
    tp, r = layout.tp, layout.tp_rank
    p = f"model.layers.{g}."
    out = {
        "input_layernorm.weight": hf[p + "input_layernorm.weight"].clone(),
        "pre_mlp_layernorm.weight": hf[p + "post_attention_layernorm.weight"].clone(),
        "self_attention.linear_qkv.weight": fuse_qkv(*(hf[f"{p}self_attn.{n}_proj.weight"] for n in "qkv"), cfg, tp, r),
        "self_attention.linear_proj.weight": _shard(hf[p + "self_attn.o_proj.weight"], 1, tp, r),
    }
    if p + "self_attn.q_proj.bias" in hf:
        out["self_attention.linear_qkv.bias"] = fuse_qkv(*(hf[f"{p}self_attn.{n}_proj.bias"] for n in "qkv"), cfg,
                                                         tp, r)
    if p + "mlp.gate.weight" not in hf:  # dense
        gate, up = hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]
        out["mlp.linear_fc1.weight"] = torch.cat([_shard(gate, 0, tp, r), _shard(up, 0, tp, r)])
        out["mlp.linear_fc2.weight"] = _shard(hf[p + "mlp.down_proj.weight"], 1, tp, r)
        return out
    out["mlp.router.weight"] = hf[p + "mlp.gate.weight"].clone()
    num_local = cfg.num_local_experts // layout.ep
    for j in range(num_local):
        e = layout.ep_rank * num_local + j
        gate, up = hf[p + "mlp.experts.gate_up_proj"][e].chunk(2, dim=0)
        q = f"mlp.experts.local_experts.{j}."
        out[q + "linear_fc1.weight"] = torch.cat([_shard(gate, 0, tp, r), _shard(up, 0, tp, r)])
        out[q + "linear_fc2.weight"] = _shard(hf[p + "mlp.experts.down_proj"][e], 1, tp, r)
    return out


def hf_to_megatron(hf: dict[str, Tensor], cfg, layout: Layout, value_head: bool = False) -> dict[str, Tensor]:
    """The local megatron state dict of the rank at (tp_rank, pp_rank, ep_rank); with `value_head` a critic's."""
    per_stage = layout.layers_per_stage(cfg.num_hidden_layers)
    first, last = layout.pp_rank == 0, layout.pp_rank == layout.pp - 1
    out: dict[str, Tensor] = {}
    for local in range(per_stage):
        g = layout.pp_rank * per_stage + local
        for name, t in _layer_to_megatron(hf, cfg, g, layout).items():
            out[f"decoder.layers.{local}.{name}"] = t
    embed = _pad_vocab(hf["model.embed_tokens.weight"], cfg, layout.tp)
    if first:
        out["embedding.word_embeddings.weight"] = _shard(embed, 0, layout.tp, layout.tp_rank)
    if last:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"].clone()
        if value_head:
            out["output_layer.weight"], out["output_layer.bias"] = (hf["lm_head.weight"].clone(),
                                                                    hf["lm_head.bias"].clone())
        elif not cfg.tie_word_embeddings:
            out["output_layer.weight"] = _shard(_pad_vocab(hf["lm_head.weight"], cfg, layout.tp), 0, layout.tp,
                                                layout.tp_rank)
        elif layout.pp > 1:
            out["output_layer.weight"] = _shard(embed, 0, layout.tp, layout.tp_rank)
    return out


def _merge_layer(get, cfg, tp: int, num_experts_local: int, ep: int) -> dict[str, Tensor]:
    """One layer in HF naming from `get(name, tp_rank, ep_rank)` over the TP (and EP) shards."""
    tps = range(tp)
    q, k, v = split_qkv([get("self_attention.linear_qkv.weight", r, 0) for r in tps], cfg)
    out = {"input_layernorm.weight": get("input_layernorm.weight", 0, 0),
           "post_attention_layernorm.weight": get("pre_mlp_layernorm.weight", 0, 0),
           "self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v,
           "self_attn.o_proj.weight": torch.cat([get("self_attention.linear_proj.weight", r, 0) for r in tps], 1)}
    bias = get("self_attention.linear_qkv.bias", 0, 0, optional=True)
    if bias is not None:
        qb, kb, vb = split_qkv([get("self_attention.linear_qkv.bias", r, 0) for r in tps], cfg)
        out.update({"self_attn.q_proj.bias": qb, "self_attn.k_proj.bias": kb, "self_attn.v_proj.bias": vb})

    def fc1(prefix, e):
        halves = [get(prefix + "linear_fc1.weight", r, e).chunk(2, dim=0) for r in tps]
        return torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])

    def fc2(prefix, e):
        return torch.cat([get(prefix + "linear_fc2.weight", r, e) for r in tps], 1)

    if get("mlp.router.weight", 0, 0, optional=True) is None:
        gate, up = fc1("mlp.", 0)
        out.update({"mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up, "mlp.down_proj.weight": fc2("mlp.", 0)})
        return out
    out["mlp.gate.weight"] = get("mlp.router.weight", 0, 0)
    gate_up, down = [], []
    for e in range(ep):
        for j in range(num_experts_local):
            prefix = f"mlp.experts.local_experts.{j}."
            gate_up.append(torch.cat(fc1(prefix, e)))
            down.append(fc2(prefix, e))
    out["mlp.experts.gate_up_proj"], out["mlp.experts.down_proj"] = torch.stack(gate_up), torch.stack(down)
    return out


def megatron_to_hf(shards: dict[tuple[int, int, int], dict[str, Tensor]], cfg, tp: int, pp: int, ep: int,
                   value_head: bool = False) -> dict[str, Tensor]:
    """Full HF state dict from every rank's local state dict, keyed by (tp_rank, pp_rank, ep_rank); with
    `value_head` a critic's."""
    per_stage = Layout(tp=tp, pp=pp, ep=ep).layers_per_stage(cfg.num_hidden_layers)
    out: dict[str, Tensor] = {}
    for stage in range(pp):
        for local in range(per_stage):
            layer = {(r, e): sd for (r, s, e), sd in shards.items() if s == stage}
            out.update(hf_layer(layer, cfg, stage * per_stage + local, tp, ep, local))
    out.update(hf_edges({(r, e): shards[(r, 0, e)] for r in range(tp) for e in range(ep)},
                        {(r, e): shards[(r, pp - 1, e)] for r in range(tp) for e in range(ep)}, cfg, tp,
                        value_head))
    return {name: t.contiguous() for name, t in out.items()}


def hf_layer(shards: dict[tuple[int, int], dict[str, Tensor]], cfg, index: int, tp: int, ep: int, local: int = 0
             ) -> dict[str, Tensor]:
    """Decoder layer `index` in HF naming from the (tp_rank, ep_rank) shards that hold it as their local layer
    `local` (`decoder.layers.{local}.*`)."""
    num_local = cfg.num_local_experts // ep if hasattr(cfg, "num_local_experts") else 1

    def get(name, r, e, optional=False):
        sd, key = shards[(r, e)], f"decoder.layers.{local}.{name}"
        return sd.get(key) if optional else sd[key]

    return {f"model.layers.{index}.{name}": t for name, t in _merge_layer(get, cfg, tp, num_local, ep).items()}


def hf_edges(first: dict[tuple[int, int], dict[str, Tensor]], last: dict[tuple[int, int], dict[str, Tensor]], cfg,
             tp: int, value_head: bool = False) -> dict[str, Tensor]:
    """Embedding, final norm and LM head (a critic's value head with `value_head`: TP rank 0's copy) from the
    (tp_rank, ep_rank) shards of the first and the last stage."""
    vocab = cfg.vocab_size
    out = {"model.embed_tokens.weight": torch.cat([first[(r, 0)]["embedding.word_embeddings.weight"]
                                                   for r in range(tp)])[:vocab],
           "model.norm.weight": last[(0, 0)]["decoder.final_layernorm.weight"]}
    if value_head:
        out["lm_head.weight"] = last[(0, 0)]["output_layer.weight"]
        out["lm_head.bias"] = last[(0, 0)]["output_layer.bias"]
    elif cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    else:
        out["lm_head.weight"] = torch.cat([last[(r, 0)]["output_layer.weight"] for r in range(tp)])[:vocab]
    return out
