"""A critic (value model) under megatron: the GPTModel of the policy's weights with the last stage's vocab-parallel
output layer replaced by the value head of `rl.backends.value_head` (one output per token, the same initial weights
as every other strategy's: a saved `score.*` head or the fixed-seed new one).

The head is whole on every TP rank. Its input is the full hidden state after the final norm (all-gathered over the
sequence with sequence parallelism, whose backward then takes this rank's slice of the gradient as it is): every TP
rank computes the same values, the same loss and so the same head gradient, and passes the backbone the whole
gradient of its hidden states, as megatron's replicated norms expect (the vocab-parallel output layer instead
all-reduces its partial input gradients). Megatron keeps it that way:
- the head's parameters carry no `tensor_model_parallel` attribute, so the grad norm counts them on TP rank 0 only
  (`param_is_not_tensor_parallel_duplicate`) and checkpoints/exports take TP rank 0's copy;
- `average_gradients_across_tp_domain` makes `finalize_model_grads` average their gradients over TP: equal
  gradients stay equal, and the copies cannot drift apart where kernels round differently on different ranks;
- no `sequence_parallel` attribute: their gradient is never summed over TP like a sequence-parallel norm's;
- the model is built untied (a critic has no output embedding), so no gradient is shared with the first stage.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rl.core.packing import PackedBatch


class ValueHead(nn.Module):
    """`Linear(hidden, 1, bias=True)` in the output layer's place: `forward(hidden [s, b, h], weight=None,
    runtime_gather_output=None)` returns ([s_full, b, 1], None) as megatron's output layer call expects."""

    def __init__(self, hidden: int, sequence_parallel: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden))
        self.bias = nn.Parameter(torch.zeros(1))
        self.sequence_parallel = sequence_parallel
        for param in (self.weight, self.bias):
            param.average_gradients_across_tp_domain = True

    def forward(self, hidden: Tensor, weight: Tensor | None = None, runtime_gather_output: bool | None = None):
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

        if self.sequence_parallel and ps.get_tensor_model_parallel_world_size() > 1:
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return nn.functional.linear(hidden, self.weight, self.bias), None


def refuse_unsupported(spec) -> None:
    """The policy-only options a critic's spec may not carry, each named by its key."""
    if spec.fused_kernels:
        raise ValueError("trainer.policy.use_fused_kernels: the fused loss computes a policy loss from the LM head's "
                         "vocabulary; a critic has a value head instead; build the critic without it")


def attach_value_heads(chunks: list[nn.Module], layouts: list, hidden: int, sequence_parallel: bool) -> None:
    """Replaces the output layer of the model chunk that is the last pipeline stage (if this rank holds it); its
    weights come with the rest of the state (`convert.hf_to_megatron(..., value_head=True)`)."""
    for chunk, layout in zip(chunks, layouts, strict=True):
        if layout.last_stage:
            chunk.output_layer = ValueHead(hidden, sequence_parallel)


def train_value_heads(chunks: list[nn.Module]) -> None:
    """A LoRA critic trains its value head whole beside the adapters (`lora.attach` froze every base parameter)."""
    for chunk in chunks:
        if isinstance(getattr(chunk, "output_layer", None), ValueHead):
            chunk.output_layer.requires_grad_(True)


def token_values(output: Tensor, batch: PackedBatch, cp=None) -> Tensor:
    """[N] float32 values aligned with the target tokens, as `hf_forward.batch_values`: entry t is the head's output
    at position t - 1, where the loss mask is set, 0 elsewhere. `output` is the last stage's [1, T, 1] (with
    context parallelism this rank's slice of the row, which a sum over the group assembles)."""
    from rl.backends.megatron.context_parallel import whole_row

    n, values = batch.num_tokens, output[0, :, 0].float()
    if cp is not None:
        local = values.shape[0]
        values = whole_row(values, cp.rank * local, local * cp.size, cp)
    aligned = PackedBatch.align_to_targets(values[:n])
    return torch.where(batch.loss_mask, aligned, torch.zeros_like(aligned))
