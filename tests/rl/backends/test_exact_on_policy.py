"""Exact on-policy arithmetic (`rl.core.batch_invariant`, trainer.exact_on_policy) on the tiny job's model.

Oracle: the same token computed another way, bit for bit. A prompt decoded alone and in a batch of 64 beside prompts
of other lengths (left padding, another KV cache) gives the same tokens and logprobs; every sampled token's logprob
equals the trainer's (`hf_forward.batch_logprobs` on the model the backends load) recomputed in one packed
micro-batch, in micro-batches cut another way, and padded. A planted kernel that is not batch-invariant (BLAS matmul
for the linear layers, what the model runs without the mode) breaks the first equality, so the comparison can see a
change of summation order. Against the float64 model the arithmetic stays within float32 rounding."""

import pytest
import torch

from rl.backends.hf_forward import batch_logprobs
from rl.backends.hf_model import load_causal_lm
from rl.core import batch_invariant
from rl.core.generation import SamplingParams, build_engine
from rl.core.packing import pack_sequences, pad_sequences
from tests.testing import tolerances
from tests.testing.tiny_job import make_tiny_job

TEMPERATURE = 0.8
# prompts of 4 to 25 tokens: a batch left-pads each by a different amount, so its keys sit at other cache offsets
PROMPTS = ["1+1=", "12+34=", "7+8+9=", "123+4+56=", "5+66+777+8=", "909+77+3+41+2=", "3+4+5+6+7+8+9+10=",
           "65+43+21+87+90+12+34+56="]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return make_tiny_job(str(tmp_path_factory.mktemp("job")))


@pytest.fixture(scope="module")
def engine(job):
    return build_engine("hf", job.model_path, job.model_path, device="cpu", exact=True)


@pytest.fixture(scope="module")
def prompts(engine):
    return [engine.tokenizer.encode(text) for text in PROMPTS]


def _alone_and_in_a_batch(engine, prompts) -> tuple[list, list]:
    """Greedy responses of prompt 0 decoded alone, and in a batch of 64 (the 8 prompts 8 times over)."""
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=24)
    alone = engine.generate([prompts[0]], params)
    batch = engine.generate(prompts * 8, params)
    return alone, [rollout for rollout in batch if rollout.prompt_ids == prompts[0]]


def test_a_token_alone_equals_the_token_in_a_batch_of_64(engine, prompts):
    alone, in_batch = _alone_and_in_a_batch(engine, prompts)
    assert len(in_batch) == 8
    for rollout in in_batch:
        assert rollout.response_ids == alone[0].response_ids
        assert rollout.raw_logprobs == alone[0].raw_logprobs


def test_a_planted_kernel_that_is_not_batch_invariant_breaks_it(engine, prompts, monkeypatch):
    monkeypatch.setattr(batch_invariant, "linear", torch.nn.functional.linear)
    alone, in_batch = _alone_and_in_a_batch(engine, prompts)
    assert any(rollout.raw_logprobs != alone[0].raw_logprobs for rollout in in_batch), \
        "BLAS matmul gave the same bits alone and in a batch of 64: this comparison cannot see a summation order"


@pytest.mark.parametrize("fn", [torch.nn.functional.silu, torch.exp, torch.sin])
def test_an_elementwise_result_does_not_depend_on_where_the_element_sits(fn):
    """CPU kernels finish a tensor with a scalar loop whose silu differs from the vector loop's in the last bit for
    some inputs (under avx2 and avx512): each value's result alone, at every offset and length, equals its result
    inside a long tensor."""
    values = torch.randn(300, generator=torch.Generator().manual_seed(0)) * 4
    whole = batch_invariant.elementwise(fn, values)
    for start in range(0, 70):
        for length in (1, 3, 17, 70):
            part = values[start:start + length]
            assert torch.equal(batch_invariant.elementwise(fn, part), whole[start:start + len(part)]), (start, length)


def _sequences(rollouts) -> list[dict]:
    sequences = []
    for rollout in rollouts:
        prompt, response = len(rollout.prompt_ids), len(rollout.response_ids)
        loss_mask = torch.zeros(prompt + response, dtype=torch.bool)
        loss_mask[prompt:] = True
        sequences.append({"input_ids": torch.tensor(rollout.prompt_ids + rollout.response_ids),
                          "loss_mask": loss_mask})
    return sequences


def _trainer_logprobs(model, sequences, batches: list[list[int]], padded: bool = False) -> list[torch.Tensor]:
    """Each sequence's response-token logprobs from the trainer's forward over the micro-batches `batches`."""
    found = {}
    for members in batches:
        chosen = [sequences[i] for i in members]
        batch = pad_sequences(chosen) if padded else pack_sequences(chosen)
        logprobs, _ = batch_logprobs(model, batch, TEMPERATURE, False, batch_invariant.NAME)
        mask = batch.loss_mask.bool()
        offsets = [0, *torch.cumsum(batch.seq_lengths if not padded else
                                    torch.full_like(batch.seq_lengths, batch.padded_length), 0).tolist()]
        for slot, index in enumerate(members):
            span = slice(offsets[slot], offsets[slot + 1])
            found[index] = logprobs[span][mask[span]]
    return [found[i] for i in range(len(sequences))]


def test_sampled_logprobs_are_the_trainers_packed_or_padded(job, engine, prompts):
    rollouts = engine.generate(prompts * 2, SamplingParams(n=4, temperature=TEMPERATURE, max_new_tokens=24,
                                                           seed=5))
    assert len(rollouts) == 64
    model = batch_invariant.make_batch_invariant(load_causal_lm(job.model_path, torch.device("cpu")))
    assert model.config._attn_implementation == batch_invariant.NAME
    sequences = _sequences(rollouts)
    every = list(range(len(sequences)))
    layouts = {"one packed micro-batch": ([every], False),
               "packed micro-batches of 5, reversed": ([every[i:i + 5][::-1] for i in range(0, 64, 5)], False),
               "padded micro-batches of 16": ([every[i:i + 16] for i in range(0, 64, 16)], True)}
    with torch.no_grad():
        for name, (batches, padded) in layouts.items():
            for rollout, logprobs in zip(rollouts, _trainer_logprobs(model, sequences, batches, padded), strict=True):
                assert logprobs.tolist() == rollout.rollout_logprobs, name


def test_within_float32_rounding_of_the_float64_model(job, engine, prompts):
    """The batch-invariant logits against transformers' own forward of the model in float64: the gap is float32's
    rounding over the network's reductions (`tolerances.network_rtol`) times the largest logit."""
    from transformers import AutoModelForCausalLM

    exact64 = AutoModelForCausalLM.from_pretrained(job.model_path, dtype=torch.float64).eval()
    ids = torch.tensor([prompts[2]])
    with torch.no_grad():
        mine = engine.model(input_ids=ids).logits[0].double()
        want = exact64(input_ids=ids).logits[0]
    bound = tolerances.network_rtol(tolerances.decoder_reductions(exact64.config, ids.shape[1]), torch.float32)
    tolerances.assert_within(mine, want, bound * float(want.abs().max()), msg="batch-invariant logits")


def test_the_backward_passes_are_the_ordinary_gradients():
    """Linear and attention keep the ordinary formulas for their gradients: against float64 autograd of
    `F.linear` and of softmax attention (causal, grouped-query, one padded key masked), within float32's rounding of
    each gradient's sums: `tolerances.matmul_gap` of the products that make a linear gradient; for attention's chain
    (scores over 8 dims, the softmax Jacobian and the values over 6 keys, the output over 8 dims) `network_rtol` of
    those reductions times a bound on each gradient entry's terms, 6 keys x 8 dims x s^4 (s the largest input or
    output-gradient magnitude; softmax weights at most 1)."""
    generator = torch.Generator().manual_seed(1)
    x, w, b = (torch.randn(*shape, generator=generator, dtype=torch.float64) for shape in ((5, 7, 16), (12, 16), (12,)))
    g = torch.randn(5, 7, 12, generator=generator, dtype=torch.float64)
    ours = [t.float().requires_grad_() for t in (x, w, b)]
    batch_invariant.linear(*ours).backward(g.float())
    want = [t.clone().requires_grad_() for t in (x, w, b)]
    torch.nn.functional.linear(*want).backward(g)
    flat_g, flat_x = g.reshape(-1, 12), x.reshape(-1, 16)
    bounds = [tolerances.matmul_gap(flat_g, w).reshape(x.shape), tolerances.matmul_gap(flat_g.t(), flat_x),
              tolerances.network_rtol([flat_g.shape[0]], torch.float32) * flat_g.abs().sum(0)]
    for name, got, expected, bound in zip(("x", "weight", "bias"), ours, want, bounds, strict=True):
        tolerances.assert_within(got.grad, expected.grad, bound, msg=f"linear d{name}")

    q, k, v = (torch.randn(2, heads, 6, 8, generator=generator, dtype=torch.float64) for heads in (4, 2, 2))
    allowed = batch_invariant.causal_mask(6, 6, torch.device("cpu"))[None, None].expand(2, 1, 6, 6).clone()
    allowed[1, :, :, 0] = False  # a left-padded key of the second row
    allowed[1, :, 0, 0] = True  # its own query still sees itself (no row without keys)
    grad_out = torch.randn(2, 6, 4, 8, generator=generator, dtype=torch.float64)

    class Module:
        is_causal = True

    ours = [t.float().requires_grad_() for t in (q, k, v)]
    out, _ = batch_invariant.attention_forward(Module(), *ours, allowed, scaling=8 ** -0.5)
    out.backward(grad_out.float())
    want = [t.clone().requires_grad_() for t in (q, k, v)]
    keys, values = (t.repeat_interleave(2, dim=1) for t in want[1:])
    scores = (want[0] @ keys.transpose(-1, -2) * 8 ** -0.5).masked_fill(~allowed, float("-inf"))
    (torch.softmax(scores, -1) @ values).transpose(1, 2).backward(grad_out)
    scale = float(max(t.abs().max() for t in (q, k, v, grad_out)))
    bound = tolerances.network_rtol([8, 6, 6, 8], torch.float32) * 6 * 8 * scale ** 4
    for name, got, expected in zip("qkv", ours, want, strict=True):
        tolerances.assert_within(got.grad, expected.grad, bound, msg=f"attention d{name}")


class _Attention:
    is_causal = True


def test_the_attention_masks_mean_one_thing():
    """The forms a mask reaches the attention function in give the same bits: none (causal), transformers' boolean
    mask, an additive one (0 and -inf), and a packed row's sequence bounds against each sequence alone; a sliding
    window drops the keys behind it. Dropout and attention sinks are refused, not ignored."""
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, heads, 9, 8, generator=generator) for heads in (4, 2, 2))
    causal = batch_invariant.causal_mask(9, 9, torch.device("cpu"))[None, None]
    plain, _ = batch_invariant.attention_forward(_Attention(), q, k, v, None)
    by_bool, _ = batch_invariant.attention_forward(_Attention(), q, k, v, causal)
    additive = torch.zeros(1, 1, 9, 9).masked_fill(~causal, float("-inf"))
    by_additive, _ = batch_invariant.attention_forward(_Attention(), q, k, v, additive)
    assert torch.equal(plain, by_bool) and torch.equal(plain, by_additive)
    bounds = torch.tensor([0, 4, 9])
    packed, _ = batch_invariant.attention_forward(_Attention(), q, k, v, None, cu_seq_lens_q=bounds)
    first, _ = batch_invariant.attention_forward(_Attention(), q[:, :, :4], k[:, :, :4], v[:, :, :4], None)
    second, _ = batch_invariant.attention_forward(_Attention(), q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], None)
    assert torch.equal(packed, torch.cat([first, second], dim=1))
    assert not torch.equal(packed, plain), "the second sequence must not see the first"
    windowed, _ = batch_invariant.attention_forward(_Attention(), q, k, v, None, sliding_window=3)
    last_three, _ = batch_invariant.attention_forward(_Attention(), q[:, :, 6:], k[:, :, 6:], v[:, :, 6:], None)
    assert torch.equal(windowed[:, 8], last_three[:, 2]) and not torch.equal(windowed[:, 8], plain[:, 8])
    with pytest.raises(ValueError, match="without dropout"):
        batch_invariant.attention_forward(_Attention(), q, k, v, None, dropout=0.1)
    with pytest.raises(ValueError, match="attention sinks"):
        batch_invariant.attention_forward(_Attention(), q, k, v, None, s_aux=torch.zeros(4))


def test_elementwise_in_pieces_equals_one_call_and_keeps_the_shape():
    values = torch.randn(3, batch_invariant.GRAIN + 100, generator=torch.Generator().manual_seed(3))
    out = batch_invariant.elementwise(torch.exp, values)
    assert out.shape == values.shape and torch.equal(out, torch.exp(values))


def test_parts_it_does_not_cover_are_refused(job):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(job.model_path)
    model.model.layers[0].extra = torch.nn.LayerNorm(4)
    with pytest.raises(ValueError, match="does not cover this layer"):
        batch_invariant.make_batch_invariant(model)
    model = AutoModelForCausalLM.from_pretrained(job.model_path)
    model.model.rotary_emb.rope_type = "yarn"
    with pytest.raises(ValueError, match="not 'yarn'"):
        batch_invariant.make_batch_invariant(model)
    model = AutoModelForCausalLM.from_pretrained(job.model_path)
    model.model.norm.bias = torch.nn.Parameter(torch.zeros(model.config.hidden_size))
    with pytest.raises(ValueError, match="RMSNorm with a weight and no bias"):
        batch_invariant.make_batch_invariant(model)
    with pytest.raises(ValueError, match="is not on the CPU; its batch-invariant arithmetic is checked bit for bit "
                                         "on CPU only"):
        batch_invariant.make_batch_invariant(AutoModelForCausalLM.from_pretrained(job.model_path).to("meta"))


def test_token_logprobs_are_log_softmax_at_the_temperature():
    """Against float64 torch: log softmax(logits / T)[target], within float32's rounding of a sum over the
    vocabulary (`network_rtol([V])` of the largest |logit| / T) plus the division's and the log's roundings."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 5
    targets = torch.tensor([0, 299, 17, 5, 150, 42])
    for temperature in (1.0, 0.7):
        got = batch_invariant.token_logprobs(logits.float(), targets, temperature)
        want = torch.log_softmax(logits / temperature, -1).gather(-1, targets[:, None])[:, 0]
        scale = float(logits.abs().max()) / temperature
        bound = (tolerances.network_rtol([300], torch.float32) + 4 * tolerances.unit_roundoff(torch.float32)) * scale
        tolerances.assert_within(got, want, bound, msg=f"token logprobs at T={temperature}")


def test_every_part_of_the_decoder_is_swapped(job):
    """Every linear layer (with its bias: a layer given one here, as Qwen2's q/k/v have), norm, rotary embedding and
    MLP activation computes the batch-invariant way after `make_batch_invariant`, and the attention is its own."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(job.model_path)
    proj = model.model.layers[0].self_attn.q_proj
    model.model.layers[0].self_attn.q_proj = torch.nn.Linear(proj.in_features, proj.out_features, bias=True)
    batch_invariant.make_batch_invariant(model)
    assert model.config._attn_implementation == batch_invariant.NAME
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(3, proj.in_features, generator=generator)
    swapped = {"Linear": batch_invariant._linear_forward, "LlamaRMSNorm": batch_invariant._rms_norm_forward,
               "LlamaRotaryEmbedding": batch_invariant._rotary_forward}
    seen = set()
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind in swapped:  # each part's forward is ours (a norm's may agree with ours on a few rows by chance)
            assert getattr(module.forward, "__func__", None) is swapped[kind], name
            seen.add(kind)
        if isinstance(module, torch.nn.Linear):
            given = torch.randn(3, module.in_features, generator=generator)
            assert torch.equal(module(given), batch_invariant.linear(given, module.weight, module.bias)), name
        if hasattr(module, "act_fn"):
            assert isinstance(module.act_fn, batch_invariant._Activation), name
    assert seen == set(swapped)
    biased = model.model.layers[0].self_attn.q_proj
    assert not torch.equal(biased(x), batch_invariant.linear(x, biased.weight)), "the bias is added"
    norm = model.model.norm
    assert torch.equal(norm(x), batch_invariant.rms_norm(x, norm.weight, norm.variance_epsilon))
    positions = torch.arange(7)[None]
    cos, _ = model.model.rotary_emb(x, positions)
    assert torch.equal(cos, batch_invariant._rotary_forward(model.model.rotary_emb, x, positions)[0])
