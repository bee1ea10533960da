"""The planner's formulas against hand-computed values for known shapes, and the activation count against the
tensors a tiny Qwen2 really saves for backward through the training forward (rl.backends.hf_forward) on CPU."""

from __future__ import annotations

import pytest
import torch

from rl.backends.planner import Knobs, PlanInputs, shape_from_config, terms
from rl.backends.planner.state import counts, deepspeed_state, fsdp_state, megatron_state
from tests.testing.model_configs import QWEN25_7B

Q7 = shape_from_config(QWEN25_7B)
P7 = 7_615_616_512


def test_layer_activations_qwen25_7b_by_hand():
    """bf16: norms 2 * ((4 + 2*2) * 3584 + 4); flash: 2 * (2*3584 + 2*512) + 4*28; sdpa_varlen: 2 * 5*3584 + 4*28;
    MLP 4 * 18944 * 2."""
    norms, mlp = 2 * (8 * 3584 + 4), 4 * 18944 * 2
    assert terms.layer_activation_bytes(Q7, 2, "flash") == norms + (2 * (2 * 3584 + 2 * 512) + 112) + mlp == 225400
    assert terms.layer_activation_bytes(Q7, 2, "sdpa_varlen") == norms + (2 * 5 * 3584 + 112) + mlp
    # TP 4 splits attention and the MLP; sequence parallelism the norms too
    tp4 = terms.layer_activation_bytes(Q7, 2, "flash", tp=4, sequence_parallel=True)
    assert tp4 == pytest.approx(225400 / 4)


def test_kv_cache_per_token():
    """vLLM: 2 * layers * kv_heads * head_dim * 2 bytes = 2 * 28 * 4 * 128 * 2 for Qwen2.5-7B in bf16."""
    assert terms.kv_bytes_per_token(Q7, 2) == 57344
    assert terms.vllm_kv_tokens(0.8 * 80 * terms.GIB, P7 * 2, Q7) == pytest.approx(
        (0.8 * 80 * 2**30 - 2 * P7) / 57344)


def test_logits_and_fused_chunk():
    assert terms.logits_bytes(1000, 152064, 2, train=True) == 1000 * 152064 * 2 * 2
    assert terms.fused_chunk_tokens(152064, None) == (64 << 20) // (4 * 152064) == 110
    assert terms.fused_loss_bytes(152064, 110) == 2 * 110 * 152064 * 4
    assert terms.vocab_parallel_logits_bytes(4096, 152064 / 2, 2) == 4096 * 76032 * 14


def test_pipeline_inflight_layers():
    assert terms.pipeline_inflight_layers(32, 1) == 32
    assert terms.pipeline_inflight_layers(32, 4) == 32  # 4 micro-batches in flight of 8 layers
    assert terms.pipeline_inflight_layers(32, 4, vp=2) == 32 * (1 + 3 / 8)


def _inputs(**kw):
    return PlanInputs(shape=Q7, **kw)


def test_fsdp2_bytes_per_parameter():
    """FSDP2 over 8 ranks, bf16: fp32 shards (4 + 4 + 8 bytes per parameter) / 8; the root (embedding, final norm,
    untied head) and two layers gathered in bf16, one unsharded fp32 gradient of the root."""
    state = fsdp_state(_inputs(world=8), Knobs("fsdp2"), Q7, counts(Q7, 0, ()), offload=False)
    assert (state.params, state.grads, state.optimizer) == (4 * P7 / 8, 4 * P7 / 8, 8 * P7 / 8)
    root, layer = 2 * 152064 * 3584 + 3584, 233_057_792
    assert state.gathered == 2 * root + 2 * 2 * layer
    assert state.grad_buffer == 4 * root
    offloaded = fsdp_state(_inputs(world=8), Knobs("fsdp2", offload=True), Q7, counts(Q7, 0, ()), offload=True)
    assert offloaded.params == offloaded.grads == offloaded.optimizer == 0


def test_deepspeed_zero_stages():
    """ZeRO's K = 12 bytes of optimizer state (fp32 master + Adam) over N from stage 1; the module in bf16 (whole
    below stage 3); fp32 gradient partitions at stages 2 and 3 (DeepSpeed 0.19), whole bf16 gradients at stage 1."""
    n, world = counts(Q7, 0, ()), 64
    inputs = _inputs(world=world)
    one = deepspeed_state(inputs, Knobs("deepspeed", zero_stage=1), Q7, n, 1)
    two = deepspeed_state(inputs, Knobs("deepspeed", zero_stage=2), Q7, n, 2)
    three = deepspeed_state(inputs, Knobs("deepspeed", zero_stage=3), Q7, n, 3)
    assert (one.params, one.grads, one.optimizer) == (2 * P7, 2 * P7 + 4 * P7 / 64, 12 * P7 / 64)
    assert (two.params, two.grads, two.optimizer) == (2 * P7, 4 * P7 / 64, 12 * P7 / 64)
    assert (three.params, three.grads, three.optimizer) == (2 * P7 / 64, 4 * P7 / 64, 12 * P7 / 64)
    assert two.gathered == 500_000_000 * 2  # the bf16 reduce bucket
    assert two.step_copy == 4 * P7 / 64  # the optimizer step's flattened fp32 copy of the gradient partition
    offload = deepspeed_state(inputs, Knobs("deepspeed", zero_stage=2, offload=True), Q7, n, 2)
    assert offload.optimizer == 0


def test_megatron_distributed_optimizer():
    """megatron's table: fp32 weights and gradients, 4 + 4 + 8/d bytes per parameter (d = 8 here, TP = PP = 1)."""
    state = megatron_state(_inputs(world=8), Knobs("megatron"), Q7, counts(Q7, 0, ()))
    assert state.params + state.grads + state.optimizer == pytest.approx((4 + 4 + 8 / 8) * P7)
    tp2 = megatron_state(_inputs(world=8), Knobs("megatron", tp=2), Q7, counts(Q7, 0, ()))
    assert tp2.params == pytest.approx(4 * P7 / 2)
    assert tp2.optimizer == pytest.approx(8 * P7 / 2 / 4)


def _saved_bytes(model, batch) -> int:
    """Bytes of every tensor the forward saves for backward (each storage once), parameters left out."""
    from rl.backends.hf_forward import batch_logprobs

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        batch_logprobs(model, batch, 1.0, False)
    return sum(seen.values())


@pytest.mark.parametrize("dtype,lora", [(torch.float32, 0), (torch.bfloat16, 0), (torch.float32, 4)])
def test_activation_count_matches_saved_tensors(tmp_path, dtype, lora):
    """A tiny Qwen2 with grouped-query attention through the training forward (sdpa_varlen, packed): the bytes a
    layer saves equal terms.layer_activation_bytes exactly (measured as the difference between 3 and 2 layers), and
    the whole forward's saved bytes equal exactly the model-level terms + the layers + the logits the logprob op
    saves + the index tensors the planner leaves out (below). With LoRA (rank 4 on every linear layer) the frozen
    norm weights save less and each adapter its A x."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rl.backends.hf_model import load_causal_lm
    from rl.core.packing import pack_sequences

    c = 2 if dtype == torch.bfloat16 else 4
    generator = torch.Generator().manual_seed(0)
    seqs = []
    for _ in range(4):
        mask = torch.arange(64) >= 16
        seqs.append({"input_ids": torch.randint(0, 512, (64,), generator=generator), "loss_mask": mask,
                     "advantages": torch.ones(64), "old_logprobs": torch.zeros(64)})
    batch = pack_sequences(seqs)
    scored = int(batch.loss_mask.sum())
    totals = {}
    for layers in (2, 3):
        config = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                             max_position_embeddings=512)
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(tmp_path / str(layers))
        model = load_causal_lm(str(tmp_path / str(layers)), torch.device("cpu"), flash_attn=False, bf16=False)
        if lora:
            from rl.backends.lora import add_lora

            add_lora(model, dict(rank=lora, alpha=8, dropout=0.0, target_modules=["all-linear"],
                                 exclude_modules=None, init_method="kaiming", merge_on_export=False),
                     str(tmp_path / str(layers)))
        totals[layers] = _saved_bytes(model.to(dtype), batch)
    shape = shape_from_config({**config.to_dict(), "num_hidden_layers": 3})
    per_layer = terms.layer_activation_bytes(shape, c, "sdpa_varlen", trainable=not lora,
                                             adapters=lora * shape.lora_linears(("all-linear",)))
    assert totals[3] - totals[2] == per_layer * 256
    logits_saved = scored * (512 * c + 8 + 4)  # the logits, the targets (int64) and the log-sum-exp (fp32)
    model_level = terms.model_activation_bytes(shape, c, scored / 256, trainable=not lora) * 256
    # Left out of terms.model_activation_bytes: once per forward, whatever the layers or dtype, the varlen
    # attention's token order and its inverse (int64 [T] each; its plan is cached per batch layout, so every layer
    # saves the same two) and the index that spreads the scored logprobs back onto the tokens (int64, one per scored
    # token): 24 bytes a token at most, 0.06% of this forward's and a few millionths of a 7B model's, below what the
    # planner resolves. With them the count is exact.
    unmodelled = 2 * 8 * 256 + 8 * scored
    assert totals[3] == 3 * per_layer * 256 + model_level + logits_saved + unmodelled
