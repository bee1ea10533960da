"""Packed rows must not attend across sequence boundaries: logprobs equal those of each sequence run alone."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rl.backends import varlen_attention
from rl.backends.hf_forward import batch_logprobs
from rl.backends.logits import token_entropy, token_logprobs
from rl.core.packing import pack_sequences, pad_sequences
from tests.testing import tolerances


@pytest.fixture(scope="module", params=["sdpa", "sdpa_varlen"])
def model(request):
    """Plain sdpa (a block-diagonal mask from the position resets) and the per-sequence sdpa_varlen path."""
    varlen_attention.register()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=48, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                         attn_implementation=request.param)
    return Qwen2ForCausalLM(config).eval()


def _sequences(lengths, prompt_lengths=None):
    """Random tokens; the loss mask covers every token after the first `prompt_lengths[i]` (default 1)."""
    g = torch.Generator().manual_seed(3)
    prompts = prompt_lengths or [1] * len(lengths)
    return [{"input_ids": torch.randint(0, 48, (n,), generator=g), "loss_mask": torch.arange(n) >= p}
            for n, p in zip(lengths, prompts, strict=True)]


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
        with torch.no_grad():
            logits = model(input_ids=seq["input_ids"][None]).logits / temperature
        atol = tolerances.logprob_gap(model.config, logits, max(len(s["input_ids"]) for s in sequences))
        torch.testing.assert_close(logprobs[start + 1:start + n], _alone(model, seq["input_ids"], temperature),
                                   rtol=0, atol=atol)
    assert entropy.shape == logprobs.shape and bool((entropy[batch.loss_mask] > 0).all())


@pytest.mark.parametrize("build", [pack_sequences, pad_sequences], ids=["packed", "padded"])
def test_prompt_positions_skip_the_lm_head_with_the_same_loss_and_gradients(model, build):
    """With prompts outside the loss mask, loss-token logprobs and the gradients of a loss over them equal the
    full-logits oracle (log_softmax of every position's logits, then the mask)."""
    sequences = _sequences([9, 4, 12, 6], prompt_lengths=[5, 1, 8, 3])
    batch = build(sequences)
    model.zero_grad()
    logprobs, _ = batch_logprobs(model, batch, 1.0, with_entropy=False)
    (logprobs * batch.loss_mask).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    oracle = []
    for seq in sequences:
        ids = seq["input_ids"]
        full = torch.log_softmax(model(input_ids=ids[None]).logits[0, :-1].float(), -1)
        oracle.append(full.gather(-1, ids[1:, None]).squeeze(-1)[seq["loss_mask"][1:]])
    torch.cat(oracle).sum().backward()

    longest = max(len(seq["input_ids"]) for seq in sequences)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids.reshape(1, -1)).logits
    atol = tolerances.logprob_gap(model.config, logits, longest)
    torch.testing.assert_close(logprobs[batch.loss_mask], torch.cat(oracle).detach(), rtol=0, atol=atol)
    if not batch.padded:
        assert bool((logprobs[~batch.loss_mask] == 0).all())
    # the gradients add every loss token's backward too
    reductions = tolerances.decoder_reductions(model.config, longest, int(batch.loss_mask.sum()))
    for got, want in zip(grads, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=tolerances.gradient_gap(want, reductions))


def test_token_logprobs_and_entropy_match_torch():
    logits = torch.randn(6, 11, dtype=torch.float64)
    targets = torch.randint(0, 11, (6,))
    expected = torch.log_softmax(logits / 2.0, -1)[torch.arange(6), targets]
    torch.testing.assert_close(token_logprobs(logits, targets, 2.0), expected.float())
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(token_entropy(logits), (-(p * p.log()).sum(-1)).float())
