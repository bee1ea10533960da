"""sdpa_varlen: per-sequence attention over a packed row equals attention over each sequence alone."""

import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rl.backends import varlen_attention
from rl.backends.varlen_attention import length_groups, packing_kwargs, varlen_sdpa
from tests.testing import tolerances


def test_length_groups_bound_the_padding():
    # Longest first. 9 joins 10: 2 * 10² = 200 <= 1.25 * (100 + 81). 4 does not: 3 * 100 > 1.25 * (181 + 16).
    # A second 4 joins the first (2 * 16 <= 1.25 * 32); a 3 would not (2 * 16 > 1.25 * (16 + 9)).
    assert length_groups((4, 10, 9, 4)) == [[1, 2], [0, 3]]
    assert length_groups((4, 10, 9, 3)) == [[1, 2], [0], [3]]
    assert length_groups((5, 5, 5)) == [[0, 1, 2]]
    assert length_groups((1,)) == [[0]]


def _alone(query, key, value, bounds, window=None):
    """Oracle: causal sdpa over each sequence on its own (grouped-query heads repeated)."""
    repeat = query.shape[1] // key.shape[1]
    out = []
    for a, b in itertools.pairwise(bounds):
        q, k, v = (t[a:b].transpose(0, 1) for t in (query, key, value))
        k, v = k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)
        mask = torch.ones(b - a, b - a, dtype=torch.bool).tril()
        if window is not None:
            mask &= ~torch.ones(b - a, b - a, dtype=torch.bool).tril(-window)
        out.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(0, 1))
    return torch.cat(out)


def _f64_rtol(query, key, lengths, backward=False):
    """Relative gap of two float64 attentions over the same sequences in other layouts (padded groups vs each alone).
    Per query, the scores are head-width dot products (gamma_D of S = max_ij sum_d |q_id k_jd| / sqrt(D), the scale's
    multiply one rounding more) and the max is one of them, so exp(s - max) is off by 2 gamma_D S plus the
    subtraction's rounding (u 2S) and the exp's own (`EXP_ROUNDINGS`); the normaliser and the weighted sum of values
    are sums over the sequence's L positions (padded keys add exact zeros), the division one rounding. Those add up to
    `network_rtol([D + 1, L, L, EXP_ROUNDINGS + 1], condition=1 + 2S)` relative to max|value| for the output. The
    backward adds dO.v over D, the softmax's row sum and the gradients' sums over L positions and over the query heads
    sharing a key head, relative to the gradient's largest |element| as `tolerances.gradient_gap`."""
    width = query.shape[-1]
    keys = key.repeat_interleave(query.shape[1] // key.shape[1], 1)
    scores = torch.einsum("qhd,khd->hqk", query.detach().abs(), keys.detach().abs()) / width**0.5
    longest = max(lengths)
    reductions = [width + 1, longest, longest, tolerances.EXP_ROUNDINGS + 1]
    if backward:
        reductions += [width, longest, longest, query.shape[1] // key.shape[1]]
    return tolerances.network_rtol(reductions, torch.float64, condition=1 + 2 * float(scores.max()))


@pytest.mark.parametrize("lengths", [[6, 6, 6], [1, 9, 2, 30, 3, 3], [17]])
@pytest.mark.parametrize("window", [None, 4])
def test_varlen_sdpa_equals_each_sequence_alone(lengths, window):
    torch.manual_seed(0)
    n = sum(lengths)
    query = torch.randn(n, 4, 8, dtype=torch.float64, requires_grad=True)
    key = torch.randn(n, 2, 8, dtype=torch.float64, requires_grad=True)
    value = torch.randn(n, 2, 8, dtype=torch.float64, requires_grad=True)
    bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    got = varlen_sdpa(query, key, value, torch.tensor(bounds, dtype=torch.int32), sliding_window=window)
    expected = _alone(query, key, value, bounds, window)
    rtol = _f64_rtol(query, key, lengths)
    tolerances.assert_within(got, expected, rtol * float(value.detach().abs().max()), "attention output")
    weights = torch.randn_like(got)
    grads = torch.autograd.grad((got * weights).sum(), (query, key, value))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (query, key, value))
    rtol = _f64_rtol(query, key, lengths, backward=True)
    for name, g, e in zip("qkv", grads, expected_grads, strict=True):
        tolerances.assert_within(g, e, rtol * float(e.abs().max()), f"d{name}")


def _model(attn_implementation):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         attn_implementation=attn_implementation)
    return LlamaForCausalLM(config)


def test_packed_model_gradients_equal_block_mask_sdpa(monkeypatch):
    """The whole model: sdpa_varlen with the packing kwargs gives plain sdpa's block-mask logits and gradients."""
    calls = []
    real = varlen_attention.varlen_sdpa
    monkeypatch.setattr(varlen_attention, "varlen_sdpa", lambda *a, **k: calls.append(1) or real(*a, **k))
    varlen = _model(varlen_attention.register())
    plain = _model("sdpa")
    lengths = [12, 1, 40, 7, 7]
    ids = torch.randint(0, 64, (1, sum(lengths)))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    logits = varlen(input_ids=ids, position_ids=positions, use_cache=False, **packing_kwargs(cu)).logits
    reference = plain(input_ids=ids, position_ids=positions, use_cache=False).logits
    assert len(calls) == 2  # one per layer: the per-sequence path ran
    torch.testing.assert_close(logits, reference, rtol=0, atol=tolerances.logprob_gap(plain.config, reference,
                                                                                     max(lengths)))
    logits.square().mean().backward()
    reference.square().mean().backward()
    # the loss sums every logit of every position
    reductions = tolerances.decoder_reductions(plain.config, max(lengths), sum(lengths) * plain.config.vocab_size)
    for (name, p), q in zip(varlen.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=tolerances.gradient_gap(q.grad, reductions), msg=name)


def test_without_packing_kwargs_it_is_plain_sdpa():
    varlen, plain = _model(varlen_attention.register()), _model("sdpa")
    ids = torch.randint(0, 64, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 6:] = 0
    torch.testing.assert_close(varlen(input_ids=ids, attention_mask=mask).logits,
                               plain(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=0)
