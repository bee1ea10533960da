"""Core attention over THD packed sequences for megatron-core's local layer spec.

megatron-core's local `DotProductAttention` rejects `PackedSeqParams` (only Transformer Engine's supports THD), so
the local spec gets this module instead: causal attention within each `cu_seqlens` segment, computed with PyTorch
SDPA (flash/efficient kernels on GPU, the math kernel on CPU). Grouped-query attention is expanded per partition.
With context parallelism the queries are this rank's slice of the row and the keys and values the whole row's
(context_parallel.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from rl.backends.megatron.context_parallel import gather_rows, query_key_mask


def segment_causal_mask(cu_seqlens: Tensor, total: int) -> Tensor:
    """[T, T] bool: token i may attend to token j iff both lie in the same segment and j <= i."""
    idx = torch.arange(total, device=cu_seqlens.device)
    segment = torch.bucketize(idx, cu_seqlens[1:].to(idx.dtype), right=True)
    return (segment[:, None] == segment[None, :]) & (idx[None, :] <= idx[:, None])


class PackedDotProductAttention(MegatronModule):
    """Drop-in for the spec's `core_attention`: takes q [T, np, hn], k/v [T, ng, hn], returns [T, np * hn]."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("megatron-core's context parallelism needs Transformer Engine attention; use "
                             "trainer.policy.megatron_config.context_parallel_size (context_parallel.py) instead")
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                attn_mask_type=None, attention_bias: Tensor | None = None,
                packed_seq_params: PackedSeqParams | None = None) -> Tensor:
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise ValueError("PackedDotProductAttention needs PackedSeqParams(qkv_format='thd')")
        cu = packed_seq_params.cu_seqlens_q_padded
        cu = packed_seq_params.cu_seqlens_q if cu is None else cu
        total, heads = query.shape[0], query.shape[1]
        groups = key.shape[1]
        row = getattr(packed_seq_params, "row", None)  # context parallelism: this rank holds a slice of the row
        if row is not None:
            key, value = gather_rows(key, row.group), gather_rows(value, row.group)
        if heads != groups:
            key = key.repeat_interleave(heads // groups, dim=1)
            value = value.repeat_interleave(heads // groups, dim=1)
        mask = query_key_mask(row, total) if row is not None else segment_causal_mask(cu, total)
        # [T, h, d] -> [1, h, T, d]
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                                             scale=self.softmax_scale)
        return out.squeeze(0).transpose(0, 1).reshape(total, -1)
