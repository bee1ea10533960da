"""Packed rows must not attend across sequence boundaries: logprobs equal those of each sequence run alone."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rl.backends import varlen_attention
from rl.backends.hf_forward import batch_logprobs
from rl.backends.logits import token_entropy, token_logprobs
from rl.core.packing import pack_sequences, pad_sequences


@pytest.fixture(scope="module", params=["sdpa", "sdpa_varlen"])
def model(request):
    """Plain sdpa (a block-diagonal mask from the position resets) and the per-sequence sdpa_varlen path."""
    varlen_attention.register()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=48, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                         attn_implementation=request.param)
    return Qwen2ForCausalLM(config).eval()


def _sequences(lengths):
    g = torch.Generator().manual_seed(3)
    return [{"input_ids": torch.randint(0, 48, (n,), generator=g), "loss_mask": torch.arange(n) > 0}
            for n in lengths]


def _alone(model, ids, temperature):
    """Oracle: the sequence by itself, log_softmax of the logits that predict tokens 1..n-1."""
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[1:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("build", [pack_sequences, pad_sequences], ids=["packed", "padded"])
def test_logprobs_equal_each_sequence_alone(model, build, temperature):
    sequences = _sequences([5, 1, 9, 2, 7])
    batch = build(sequences)
    with torch.no_grad():
        logprobs, entropy = batch_logprobs(model, batch, temperature, with_entropy=True)
    starts = batch.cu_seqlens[:-1].tolist()
    for seq, start in zip(sequences, starts, strict=True):
        n = len(seq["input_ids"])
        torch.testing.assert_close(logprobs[start + 1:start + n], _alone(model, seq["input_ids"], temperature),
                                   rtol=1e-5, atol=1e-5)
    assert entropy.shape == logprobs.shape and bool((entropy[batch.loss_mask] > 0).all())


def test_token_logprobs_and_entropy_match_torch():
    logits = torch.randn(6, 11, dtype=torch.float64)
    targets = torch.randint(0, 11, (6,))
    expected = torch.log_softmax(logits / 2.0, -1)[torch.arange(6), targets]
    torch.testing.assert_close(token_logprobs(logits, targets, 2.0), expected.float())
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(token_entropy(logits), (-(p * p.log()).sum(-1)).float())
