"""A megatron-core GPTModel built from a Hugging Face config, with the local layer spec (no Transformer Engine/Apex).

Families: dense Qwen2 / Llama / Mistral (RMSNorm, SwiGLU, RoPE, optional qkv bias, tied or untied embeddings) and
the Mixtral mixture of experts (top-k softmax router, SwiGLU experts). Core attention is the THD-capable
`PackedDotProductAttention`; every fusion is off so the same code runs on CPU and GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rl.backends.megatron.config import model_problems

DENSE_TYPES = ("qwen2", "llama", "mistral")
MOE_TYPES = ("mixtral",)


@dataclass(frozen=True)
class Layout:
    """How the model is split: TP, PP, EP sizes and this rank's coordinates; VP model chunks per pipeline rank
    (the interleaved schedule)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    tp_rank: int = 0
    pp_rank: int = 0
    ep_rank: int = 0
    vp: int = 1

    def layers_per_stage(self, num_layers: int) -> int:
        """Layers per model chunk (per pipeline stage when VP = 1)."""
        if num_layers % (self.pp * self.vp):
            raise ValueError(f"trainer.policy.megatron_config: PP {self.pp} * VP {self.vp} must divide the model's "
                             f"{num_layers} layers; pick divisors")
        return num_layers // (self.pp * self.vp)

    def chunk(self, k: int) -> Layout:
        """Model chunk k of this rank as a stage of a plain pipeline of PP * VP stages: megatron's interleaved
        schedule gives chunk k of pipeline rank r the layer block k * PP + r. Conversion and checkpoints see each
        chunk this way, so a PP = p, VP = v model is stored as a PP = p * v one."""
        return Layout(tp=self.tp, pp=self.pp * self.vp, ep=self.ep, tp_rank=self.tp_rank,
                      pp_rank=k * self.pp + self.pp_rank, ep_rank=self.ep_rank)

    def chunks(self) -> list[Layout]:
        return [self.chunk(k) for k in range(self.vp)]

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def rope_theta(hf_config) -> float:
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    if params.get("rope_type", params.get("type", "default")) != "default":
        raise ValueError(f"{hf_config.model_type}: only plain RoPE is supported by the megatron backend, got "
                         f"rope parameters {params}")
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Vocab rounded up to a multiple of TP (megatron splits the embedding rows evenly); extra rows are masked."""
    return -(-vocab_size // tp) * tp


def head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def check_divisible(hf_config, layout: Layout) -> None:
    """The model's sizes against the layout, with the key to change (the config check does the same at load time
    for a local model; megatron-core only asserts)."""
    problems = model_problems(hf_config, layout.tp, layout.pp, layout.ep, layout.vp)
    if problems:
        raise ValueError("; ".join(f"{key}: {problem}" for key, problem in problems))


def transformer_config(hf_config, layout: Layout, sequence_parallel: bool = False,
                       recompute_granularity: str | None = None, extra: dict | None = None,
                       params_dtype: torch.dtype = torch.float32):
    from megatron.core.transformer.transformer_config import TransformerConfig

    kind = hf_config.model_type
    if kind not in DENSE_TYPES + MOE_TYPES:
        raise ValueError(f"trainer.policy.model.path: model_type {kind!r} is not supported by the megatron backend "
                         f"(supported: {', '.join(DENSE_TYPES + MOE_TYPES)})")
    check_divisible(hf_config, layout)
    kwargs = dict(
        num_layers=hf_config.num_hidden_layers, hidden_size=hf_config.hidden_size,
        num_attention_heads=hf_config.num_attention_heads, num_query_groups=hf_config.num_key_value_heads,
        kv_channels=head_dim(hf_config), ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm", layernorm_epsilon=hf_config.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=kind == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
        hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False, use_cpu_initialization=True, perform_initialization=False,
        params_dtype=params_dtype, pipeline_dtype=params_dtype, bf16=params_dtype == torch.bfloat16,
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vp if layout.vp > 1 else None,
        expert_model_parallel_size=layout.ep, sequence_parallel=sequence_parallel,
    )
    if layout.vp > 1:
        # Megatron-LM's default for the interleaved schedule: separate isend/irecv, overlapped with compute. The
        # batched form posts both directions to one peer (PP = 2: the previous and next stage are the same rank)
        # in an order that can pair an activation with a gradient buffer.
        kwargs.update(overlap_p2p_comm=True, batch_p2p_comm=False)
    if recompute_granularity:
        kwargs["recompute_granularity"] = recompute_granularity
        if recompute_granularity == "full":
            kwargs.update(recompute_method="uniform", recompute_num_layers=1)
    if kind in MOE_TYPES:
        kwargs.update(
            num_moe_experts=hf_config.num_local_experts, moe_router_topk=hf_config.num_experts_per_tok,
            moe_ffn_hidden_size=hf_config.intermediate_size, moe_router_load_balancing_type="none",
            moe_aux_loss_coeff=0.0, moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False,
            expert_tensor_parallel_size=layout.tp,
        )
    kwargs.update(extra or {})
    return TransformerConfig(**kwargs)


def block_spec(config, num_local_layers: int):
    """The local spec with the THD-capable core attention and an RMSNorm that supports sequence parallelism."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from rl.backends.megatron.attention import PackedDotProductAttention
    from rl.backends.megatron.norm import RMSNorm

    spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = PackedDotProductAttention
    spec.submodules.input_layernorm = RMSNorm
    spec.submodules.pre_mlp_layernorm = RMSNorm
    return TransformerBlockSubmodules(layer_specs=[spec] * num_local_layers, layer_norm=RMSNorm)


def mark_tensor_parallel(model) -> None:
    """Sets megatron's `tensor_model_parallel` / `partition_dim` on sharded weights: megatron-core only sets them
    while initializing weights, which is skipped here (`perform_initialization=False`, the weights come from HF)."""
    from megatron.core import tensor_parallel as tp

    dims = {tp.ColumnParallelLinear: 0, tp.RowParallelLinear: 1, tp.VocabParallelEmbedding: 0}
    for module in model.modules():
        dim = next((d for cls, d in dims.items() if isinstance(module, cls)), None)
        weight = getattr(module, "weight", None)
        if dim is not None and weight is not None and not getattr(weight, "tensor_model_parallel", False):
            tp.set_tensor_model_parallel_attributes(weight, True, dim, 1)


def match_padding_idx(model, pad_token_id: int | None) -> None:
    """Hugging Face embeddings use `padding_idx = pad_token_id`: lookups of the pad token give its row no gradient
    (the tied output layer still does). Zeroing the embedding output's gradient at pad positions does the same."""
    embedding = getattr(getattr(model, "embedding", None), "word_embeddings", None)
    if embedding is None or pad_token_id is None:
        return

    def hook(_module, inputs, output):
        if not output.requires_grad:
            return
        keep = (inputs[0] != pad_token_id).to(output.dtype)  # [b, s]
        if output.shape[:2] != keep.shape:  # sequence parallel: output is this TP rank's [s / TP, b, h] slice
            from megatron.core import parallel_state as ps

            keep = keep.t().chunk(ps.get_tensor_model_parallel_world_size())[ps.get_tensor_model_parallel_rank()]
        keep = keep.unsqueeze(-1)
        output.register_hook(lambda grad: grad * keep)

    embedding.register_forward_hook(hook)


def build_gpt_model(hf_config, config, layout: Layout, vp_stage: int = 0):
    """Model chunk `vp_stage` of this rank (the whole local model when VP = 1)."""
    from megatron.core.models.gpt import GPTModel

    chunk = layout.chunk(vp_stage)
    model = GPTModel(
        config=config, transformer_layer_spec=block_spec(config, layout.layers_per_stage(hf_config.num_hidden_layers)),
        vocab_size=padded_vocab_size(hf_config.vocab_size, layout.tp),
        max_sequence_length=hf_config.max_position_embeddings, pre_process=chunk.first_stage,
        post_process=chunk.last_stage, parallel_output=True,
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings), position_embedding_type="rope",
        rotary_base=rope_theta(hf_config), vp_stage=vp_stage if layout.vp > 1 else None,
    )
    mark_tensor_parallel(model)
    match_padding_idx(model, getattr(hf_config, "pad_token_id", None))
    return model
