"""LoRA adapters on megatron-core's tensor-parallel linear layers, one adapter per Hugging Face projection so that
a megatron run trains exactly the model PEFT builds on the HF side (`rl.backends.lora`).

The fused layers keep their HF parts apart: `linear_qkv` holds q_proj, k_proj and v_proj adapters (their outputs
interleaved by query group like the fused weight), `linear_fc1` gate_proj and up_proj ([gate; up] per TP rank),
`linear_proj` o_proj, `linear_fc2` down_proj. Sharding follows the base layer so that the product is the unsplit
adapter's on every layout:
- column-parallel (output rows split over TP): A [r, in] whole on every TP rank, B [out / TP, r] split like W;
  the rank-r activation's gradient is all-reduced over TP (each rank's B sees only its rows), which makes A's
  gradient whole on every rank; with sequence parallelism the input is all-gathered first.
- row-parallel (input columns split): A [r, in / TP] split like W, the rank-r activation all-reduced over TP,
  B [out, r] whole; with sequence parallelism the output is scattered like the base output.
A weight's merged value, W + alpha / r * B A, is therefore local to each rank: engines, exports and conversion take
merged shards through the existing converters. Adapters sit under `<linear>.lora.<hf_name>.lora_{A,B}`; the base
layers keep their names, frozen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from rl.backends.megatron.convert import _qkv_groups

# megatron linear -> (the HF projections it fuses, whether it is column-parallel)
LINEARS = {
    "self_attention.linear_qkv": (("q_proj", "k_proj", "v_proj"), True),
    "self_attention.linear_proj": (("o_proj",), False),
    "mlp.linear_fc1": (("gate_proj", "up_proj"), True),
    "mlp.linear_fc2": (("down_proj",), False),
}
HF_MODULE = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "down_proj": "mlp.down_proj"}
_HF_ADAPTER = ".lora_{}.default.weight"  # the adapted HF model's naming (rl.backends.lora)
VALUE_HEAD = "output_layer."  # a critic's head on the last stage (critic.ValueHead)


class Adapters(nn.Module):
    """The adapters of one megatron linear layer (a ParameterDict per HF projection it fuses)."""

    def __init__(self, parts: dict[str, tuple[Tensor, Tensor]], column: bool, scale: float, combine,
                 sequence_parallel: bool):
        super().__init__()
        self.column, self.scale, self.combine, self.enabled = column, scale, combine, True
        self.sequence_parallel = sequence_parallel
        self.names = list(parts)
        for name, (a, b) in parts.items():
            self.add_module(name, nn.ParameterDict({"lora_A": nn.Parameter(a), "lora_B": nn.Parameter(b)}))
            _mark(self[name]["lora_B" if column else "lora_A"], 0 if column else 1)

    def __getitem__(self, name: str) -> nn.ParameterDict:
        return getattr(self, name)

    def forward(self, x: Tensor) -> Tensor:
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel as tp

        sequence_parallel = self.sequence_parallel and ps.get_tensor_model_parallel_world_size() > 1
        a = torch.cat([self[n]["lora_A"] for n in self.names])
        if self.column:
            if sequence_parallel:  # the gradient that reaches x is whole: take this rank's rows of it
                x = tp.gather_from_sequence_parallel_region(x, tensor_parallel_output_grad=False)
            h = tp.copy_to_tensor_model_parallel_region(x @ a.t())
            outs = [h_part @ self[n]["lora_B"].t() for n, h_part in zip(self.names, h.split(_ranks(self), -1),
                                                                        strict=True)]
            return self.combine(dict(zip(self.names, outs, strict=True)), x.shape[:-1]) * self.scale
        h = tp.reduce_from_tensor_model_parallel_region(x @ a.t())
        out = h @ self[self.names[0]]["lora_B"].t() * self.scale
        return tp.scatter_to_sequence_parallel_region(out) if sequence_parallel else out

    def delta(self) -> Tensor:
        """alpha / r * B A in the layout of this rank's shard of the base weight."""
        with torch.no_grad():
            deltas = {n: self[n]["lora_B"].float() @ self[n]["lora_A"].float() for n in self.names}
            if not self.column:
                return deltas[self.names[0]] * self.scale
            return self.combine(deltas, ()) * self.scale


def _mark(param: nn.Parameter, dim: int) -> None:
    from megatron.core import tensor_parallel as tp

    tp.set_tensor_model_parallel_attributes(param, True, dim, 1)


def _ranks(adapters: Adapters) -> list[int]:
    return [adapters[n]["lora_A"].shape[0] for n in adapters.names]


def _qkv_combine(cfg, sizes: dict[str, int]):
    """Outputs (or weight deltas) of q/k/v interleaved by query group like megatron's fused QKV; a projection
    without an adapter contributes zeros."""
    _, per_group, d = _qkv_groups(cfg)
    widths = {"q_proj": per_group * d, "k_proj": d, "v_proj": d}

    def combine(parts: dict[str, Tensor], lead: tuple) -> Tensor:
        some = next(iter(parts.values()))
        groups = sizes["k_proj"] // d
        if lead:  # activations [..., out]
            pieces = [parts[n].reshape(*lead, groups, widths[n]) if n in parts
                      else some.new_zeros(*lead, groups, widths[n]) for n in widths]
            return torch.cat(pieces, -1).reshape(*lead, -1)
        tail = some.shape[1:]  # weight deltas [out, in]
        pieces = [parts[n].reshape(groups, widths[n], *tail) if n in parts
                  else some.new_zeros(groups, widths[n], *tail) for n in widths]
        return torch.cat(pieces, 1).reshape(-1, *tail)

    return combine


def _fc1_combine(sizes: dict[str, int]):
    def combine(parts: dict[str, Tensor], lead: tuple) -> Tensor:
        some = next(iter(parts.values()))
        dim = -1 if lead else 0
        pieces = []
        for name in ("gate_proj", "up_proj"):
            if name in parts:
                pieces.append(parts[name])
            else:
                shape = list(some.shape)
                shape[dim] = sizes[name]
                pieces.append(some.new_zeros(shape))
        return torch.cat(pieces, dim)

    return combine


def _local_sizes(cfg, tp: int) -> dict[str, int]:
    """Each projection's output rows on one TP rank."""
    groups, per_group, d = _qkv_groups(cfg)
    return {"q_proj": groups * per_group * d // tp, "k_proj": groups * d // tp, "v_proj": groups * d // tp,
            "gate_proj": cfg.intermediate_size // tp, "up_proj": cfg.intermediate_size // tp}


def adapted_layers(hf_adapters: dict[str, Tensor]) -> dict[int, set[str]]:
    """{global layer: the HF projections with adapters} from the adapted HF model's adapter tensors; a module
    megatron's layers cannot carry is refused by name."""
    by_layer: dict[int, set[str]] = {}
    for name in hf_adapters:
        if not name.endswith(_HF_ADAPTER.format("A")):
            continue
        module = name[: -len(_HF_ADAPTER.format("A"))]
        parts = module.split(".")
        if len(parts) != 5 or parts[:2] != ["model", "layers"] or ".".join(parts[3:]) not in HF_MODULE.values():
            raise ValueError(f"trainer.policy.model.lora.target_modules: the megatron backend puts adapters on "
                             f"{', '.join(sorted(HF_MODULE))} only, not on {module}; leave it out "
                             "(or add it to exclude_modules)")
        by_layer.setdefault(int(parts[2]), set()).add(parts[-1])
    return by_layer


def attach(chunk: nn.Module, hf_adapters: dict[str, Tensor], cfg, layout, scale: float,
           sequence_parallel: bool) -> list[Adapters]:
    """Adapters on the layers of one model chunk (`layout`: the chunk's place as a stage, `Layout.chunk`), their
    values the TP shards of the HF adapters (`hf_adapters` in the adapted HF model's naming); every base parameter
    frozen. Returns the adapter modules."""
    chunk.requires_grad_(False)
    per_stage = layout.layers_per_stage(cfg.num_hidden_layers)
    sizes = _local_sizes(cfg, layout.tp)
    combines = {"self_attention.linear_qkv": _qkv_combine(cfg, sizes), "mlp.linear_fc1": _fc1_combine(sizes)}
    adapted = adapted_layers(hf_adapters)
    made = []
    for local in range(per_stage):
        g = layout.pp_rank * per_stage + local
        layer = chunk.decoder.layers[local]
        for path, (names, column) in LINEARS.items():
            parts = {}
            for name in names:
                if name not in adapted.get(g, ()):
                    continue
                key = f"model.layers.{g}.{HF_MODULE[name]}"
                a, b = hf_adapters[key + _HF_ADAPTER.format("A")], hf_adapters[key + _HF_ADAPTER.format("B")]
                if column:
                    b = b.chunk(layout.tp, 0)[layout.tp_rank]
                else:
                    a = a.chunk(layout.tp, 1)[layout.tp_rank]
                parts[name] = (a.detach().clone().float(), b.detach().clone().float())
            if not parts:
                continue
            linear = layer.get_submodule(path)
            adapters = Adapters(parts, column, scale, combines.get(path), sequence_parallel)
            linear.add_module("lora", adapters)
            linear.register_forward_hook(_add_adapter_output)
            made.append(adapters)
    return made


def _add_adapter_output(linear: nn.Module, args: tuple, output: tuple) -> tuple:
    adapters = linear.lora
    if not adapters.enabled:
        return output
    out, bias = output
    return out + adapters(args[0]).to(out.dtype), bias


@contextlib.contextmanager
def disabled(adapters: list[Adapters]):
    """The base model: adapters off for the block (the reference model of a LoRA run)."""
    for module in adapters:
        module.enabled = False
    try:
        yield
    finally:
        for module in adapters:
            module.enabled = True


def is_adapter_key(name: str) -> bool:
    return ".lora." in name


def merged(state: dict[str, Tensor], chunk: nn.Module) -> dict[str, Tensor]:
    """A chunk's weights with each adapted weight merged (W + alpha / r * B A on this rank's shard) and the adapter
    tensors dropped: the base model's megatron state, as the converters take it."""
    out = {name: value for name, value in state.items() if not is_adapter_key(name)}
    for name, module in chunk.named_modules():
        if isinstance(module, Adapters):
            key = name[: -len(".lora")] + ".weight"
            weight = out[key]
            out[key] = (weight.float() + module.delta().to(weight.device)).to(weight.dtype)
    return out


def adapter_state(state: dict[str, Tensor], critic: bool = False) -> dict[str, Tensor]:
    """What a LoRA checkpoint keeps of a chunk's state: the adapters, and a critic's value head."""
    return {name: value for name, value in state.items()
            if is_adapter_key(name) or (critic and name.startswith(VALUE_HEAD))}


def to_hf(shards: dict[tuple[int, int, int], dict[str, Tensor]], cfg, tp: int, pp: int) -> Iterator[tuple[str, Tensor]]:
    """The adapters in the adapted HF model's naming (`model.layers.N.self_attn.q_proj.lora_A.default.weight`),
    from every rank's adapter tensors keyed by (tp_rank, pp_rank, ep_rank) of a plain PP pipeline: the
    Megatron -> PEFT naming, TP shards joined the way `attach` cut them; a critic's value head (whole on every TP
    rank of the last stage) as `lm_head.*`."""
    per_stage = cfg.num_hidden_layers // pp
    last = shards[(0, pp - 1, 0)]
    for part in ("weight", "bias"):
        if VALUE_HEAD + part in last:
            yield f"lm_head.{part}", last[VALUE_HEAD + part]
    for stage in range(pp):
        for local in range(per_stage):
            for path, (names, column) in LINEARS.items():
                for name in names:
                    prefix = f"decoder.layers.{local}.{path}.lora.{name}."
                    if prefix + "lora_A" not in shards[(0, stage, 0)]:
                        continue
                    a = [shards[(r, stage, 0)][prefix + "lora_A"] for r in range(tp)]
                    b = [shards[(r, stage, 0)][prefix + "lora_B"] for r in range(tp)]
                    key = f"model.layers.{stage * per_stage + local}.{HF_MODULE[name]}"
                    yield key + _HF_ADAPTER.format("A"), a[0] if column else torch.cat(a, 1)
                    yield key + _HF_ADAPTER.format("B"), torch.cat(b, 0) if column else b[0]
