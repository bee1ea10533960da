"""A model's shape from its Hugging Face `config.json`, and its parameter counts.

Each count is the sum of the weight matrices (and vectors) of a decoder as transformers builds it for the Llama,
Qwen2, Qwen3, Mistral, Mixtral and Qwen2-MoE families; the tests check them against `numel()` of models built from
small configs, and against the published totals of Qwen2.5-0.5B (494,032,768), Qwen2.5-7B (7,615,616,512),
Mixtral-8x7B (46,702,792,704) and Llama-2-70B (68,976,648,192). Multi-head latent attention (DeepSeek-V2/V3) is
counted as grouped-query attention with the config's head counts: close for the planner's purpose, not exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

QKV_BIAS_TYPES = ("qwen2",)
"""Model types whose q/k/v projections always carry a bias (Qwen2Attention builds them with `bias=True`)."""
UNTIED_DEFAULT_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe")
"""Model types whose config class defaults `tie_word_embeddings` to false (PretrainedConfig's default is true)."""


class ShapeError(ValueError):
    """A config.json that lacks what the planner needs; the message names the key."""


@dataclass(frozen=True)
class ModelShape:
    """What the planner's formulas read of a decoder-only model."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    experts: int = 0
    """Routed experts per MoE layer (0: a dense model)."""
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    """Width of the shared expert(s) of an MoE layer (Qwen2-MoE, DeepSeek), 0 without."""
    moe_layers: int = 0
    model_type: str = ""
    vision: bool = False
    """A vision-language model's language half (its config has a vision_config); the vision tower itself is not
    counted by these formulas."""

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    # --- parameter counts ----------------------------------------------------------------------------------
    def embedding_params(self) -> int:
        """V * h: the input embedding (and, tied, the LM head too)."""
        return self.vocab * self.hidden

    def head_params(self) -> int:
        """V * h for an untied LM head, 0 for a tied one (it is the embedding)."""
        return 0 if self.tied else self.vocab * self.hidden

    def attention_params(self) -> int:
        """q: h * a*d, k and v: h * kv*d each, o: a*d * h; biases of q/k/v (a*d + 2 kv*d) and o (h) where the
        model has them; Qwen3's per-head q/k norms (2 d)."""
        h, qd, kvd = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        count = h * qd + 2 * h * kvd + qd * h
        count += (qd + 2 * kvd) if self.qkv_bias else 0
        count += h if self.o_bias else 0
        return count + (2 * self.head_dim if self.qk_norm else 0)

    def mlp_params(self, width: int) -> int:
        """A gated (SwiGLU) MLP: gate and up h * f, down f * h; biases 2f + h where `mlp_bias`."""
        return 3 * self.hidden * width + ((2 * width + self.hidden) if self.mlp_bias else 0)

    def expert_params(self) -> int:
        """The routed experts of one MoE layer: E gated MLPs of the expert width."""
        return self.experts * self.mlp_params(self.expert_intermediate)

    def moe_dense_params(self) -> int:
        """What every rank of one MoE layer holds besides the routed experts: the router (h * E), the shared
        expert and its gate (Qwen2-MoE's h * 1)."""
        shared = self.mlp_params(self.shared_intermediate) + self.hidden if self.shared_intermediate else 0
        return self.hidden * self.experts + shared

    def layer_params(self, moe: bool) -> int:
        """One decoder layer without its routed experts: attention, two RMSNorm weights (2h), and the dense MLP
        (a dense layer) or the router and shared expert (an MoE layer)."""
        mlp = self.moe_dense_params() if moe else self.mlp_params(self.intermediate)
        return self.attention_params() + 2 * self.hidden + mlp

    def dense_params(self) -> int:
        """Every parameter but the routed experts: embedding, layers, final norm (h), untied head."""
        dense_layers = self.layers - self.moe_layers
        return (self.embedding_params() + self.head_params() + self.hidden
                + dense_layers * self.layer_params(False) + self.moe_layers * self.layer_params(True))

    def routed_expert_params(self) -> int:
        return self.moe_layers * self.expert_params()

    def total_params(self) -> int:
        return self.dense_params() + self.routed_expert_params()

    def largest_layer_params(self) -> int:
        """The largest decoder layer with its experts: FSDP's unit of gathering."""
        dense = self.layer_params(False) if self.layers > self.moe_layers else 0
        moe = self.layer_params(True) + self.expert_params() if self.moe_layers else 0
        return max(dense, moe)

    def root_params(self) -> int:
        """What FSDP's root unit holds besides the layers: embedding, final norm, untied head."""
        return self.embedding_params() + self.hidden + self.head_params()

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """LoRA adapters of rank r on the named linear layers of every decoder layer: r * (in + out) each (A is
        r x in, B is out x r; Hu et al. 2021). `all-linear` takes every linear layer but the LM head. Routed
        experts get none: transformers holds them as fused 3-D weights, not linear layers (a shared expert is an
        ordinary MLP and gets them; so does a router that is a linear layer, which this leaves out)."""
        if rank <= 0:
            return 0
        h, qd, kvd, f = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        attention = {"q_proj": h + qd, "k_proj": h + kvd, "v_proj": h + kvd, "o_proj": qd + h}
        every = "all-linear" in targets

        def mlp(width: int) -> dict[str, int]:
            return {"gate_proj": h + width, "up_proj": h + width, "down_proj": width + h}

        def pick(sizes: dict[str, int]) -> int:
            return sum(size for name, size in sizes.items() if every or name in targets)

        per_dense = pick(attention) + pick(mlp(f))
        per_moe = pick(attention)
        if self.shared_intermediate:
            per_moe += pick(mlp(self.shared_intermediate))
        return rank * ((self.layers - self.moe_layers) * per_dense + self.moe_layers * per_moe)

    def lora_linears(self, targets: tuple[str, ...], moe: bool = False) -> int:
        """How many linear layers of one decoder layer get an adapter (see `lora_params`)."""
        names = ("q_proj", "k_proj", "v_proj", "o_proj") + (() if moe and not self.shared_intermediate else
                                                             ("gate_proj", "up_proj", "down_proj"))
        return sum(1 for name in names if "all-linear" in targets or name in targets)


def _first(config: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def _moe_layer_count(config: Mapping[str, Any], layers: int) -> int:
    """Decoder layers with routed experts: all but DeepSeek's `first_k_dense_replace` leading dense layers, Qwen's
    `mlp_only_layers`, and (Qwen2-MoE's `decoder_sparse_step`) only every step-th layer."""
    dense = set(config.get("mlp_only_layers") or ())
    dense |= set(range(int(config.get("first_k_dense_replace") or 0)))
    step = int(config.get("decoder_sparse_step") or 1)
    return sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)


def shape_from_config(config: Mapping[str, Any], source: str = "config.json") -> ModelShape:
    """The shape of a decoder from its config.json (a dict); a composite config's `text_config` is read. Raises
    ShapeError naming a missing key."""
    vision = isinstance(config.get("vision_config"), Mapping)
    if isinstance(config.get("text_config"), Mapping):
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type",
                                                                                   config.get("model_type"))}
    missing = [name for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
               if config.get(name) is None]
    if missing:
        raise ShapeError(f"{source} lacks {', '.join(missing)}: the planner needs them to size the model")
    model_type = str(config.get("model_type") or "")
    hidden, layers, heads = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(
        config["num_attention_heads"])
    attention_bias = bool(config.get("attention_bias", False))
    qwen = model_type in QKV_BIAS_TYPES or model_type == "qwen2_moe"
    experts = int(_first(config, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    expert_width = int(_first(config, "moe_intermediate_size", "intermediate_size", default=0))
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    if not shared and config.get("n_shared_experts"):
        shared = int(config["n_shared_experts"]) * expert_width
    tied = config.get("tie_word_embeddings")
    return ModelShape(
        hidden=hidden, layers=layers, heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate=int(_first(config, "intermediate_size", default=4 * hidden)),
        vocab=int(config["vocab_size"]),
        tied=bool(tied) if tied is not None else model_type not in UNTIED_DEFAULT_TYPES,
        qkv_bias=(True if model_type in QKV_BIAS_TYPES else bool(config.get("qkv_bias", True))) if qwen
        else attention_bias,
        o_bias=attention_bias and not qwen,
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=model_type.startswith("qwen3"),
        experts=experts,
        experts_per_token=int(config.get("num_experts_per_tok") or (2 if experts else 0)),
        expert_intermediate=expert_width if experts else 0,
        shared_intermediate=shared if experts else 0,
        moe_layers=_moe_layer_count(config, layers) if experts else 0,
        model_type=model_type,
        vision=vision,
    )
