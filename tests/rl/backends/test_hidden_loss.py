"""trainer.policy.use_fused_kernels on the Hugging Face strategies, in one process: the loss from hidden states and
the (gathered) LM-head weight gives the logits path's loss, metrics, logprobs and gradient of every parameter
(the logits path, `batch_logprobs` + `compute_policy_loss`, is the oracle), packed and padded, tied and untied
embeddings (tied ones share one gradient buffer, `tied_grad`; FSDP2 defers the head's weight gradient to the
lookup's backward), FSDP2 / FSDP / DeepSpeed ZeRO-2 and ZeRO-3."""

import pytest
import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.registry import build_backend
from rl.core.packing import pack_sequences, pad_sequences
from tests.testing import loss_gaps, tolerances
from tests.testing.loss_settings import FUSED_LOSS_SETTINGS

VOCAB = 96

SETTINGS = FUSED_LOSS_SETTINGS

CASES = [  # (strategy, backend options); ZeRO-3 partitions the head weight even in one process
    ("fsdp2", None),
    ("fsdp", None),
    ("deepspeed", None),
    ("deepspeed", {"zero_optimization": {"stage": 3}}),
]


@pytest.fixture(scope="module", autouse=True)
def _process_group():
    init_distributed(0, 1, "127.0.0.1", 0)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def model_path(request, tmp_path_factory):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=request.param, initializer_range=0.2,
                         pad_token_id=1)  # a token of the batches: its embedding row gets no lookup gradient
    path = str(tmp_path_factory.mktemp("tied" if request.param else "untied"))
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def _sequences(seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for n, prompt in ((7, 3), (11, 2), (5, 4), (9, 5)):
        mask = torch.arange(n) >= prompt
        seqs.append({"input_ids": torch.randint(1, VOCAB, (n,), generator=g), "loss_mask": mask,
                     "advantages": torch.randn(n, generator=g) * mask})
    return seqs


def _batch(padded: bool, oracle, on_policy: bool):
    """A batch whose old / reference logprobs sit near the model's own (ratios on both sides of the clip range)."""
    batch = (pad_sequences if padded else pack_sequences)(_sequences())
    lp, _ = oracle.logprobs(batch)
    g = torch.Generator().manual_seed(1)
    mask = batch.loss_mask.float()
    ref = lp + 0.3 * torch.randn(lp.shape, generator=g) * mask
    old = None if on_policy else lp + 0.3 * torch.randn(lp.shape, generator=g) * mask
    return batch.replace(old_logprobs=old, ref_logprobs=ref)


def _backend(path, strategy, options, fused):
    spec = ModelSpec(path=path, role="policy", temperature=0.8, backend_options=options, fused_kernels=fused,
                     fused_chunk_size=5 if fused else None)
    return build_backend(strategy, spec, init_distributed(0, 1, "127.0.0.1", 0))


def _grads(backend) -> dict[str, torch.Tensor]:
    if hasattr(backend, "engine"):
        from deepspeed.utils import safe_get_full_grad

        return {name: safe_get_full_grad(p).clone() for name, p in backend.engine.module.named_parameters()}
    full = lambda g: g.full_tensor() if hasattr(g, "full_tensor") else g  # noqa: E731
    return {name: full(p.grad).clone() for name, p in backend.model.named_parameters()}


def _grad_rtol(path, batch) -> float:
    """Relative gap (to a tensor's largest |gradient|) of the two paths' parameter gradients. The reductions, as in
    test_lora's `_float32_rtol`: the loss and weight-gradient sums over the batch's tokens, the vocabulary's softmax,
    the final norm and the head, and per layer two norms and four projections over the hidden size, the MLP's inner
    size, a head's width, the softmax and weighted sum over the longest sequence. On CUDA the backends train in bf16
    mixed precision (bf16 parameters and activations, fp32 accumulation): each op's bf16 output on the backward path
    rounds once more (per layer two norms, four projections, the attention's scores, softmax and weighted sum, the
    MLP's three projections and its gate product: 13; the head, its input gradient and the final norm: 3), and two
    runs' roundings compound to 2 * gamma_n(bf16) (`tolerances.rounded_gap`, chained)."""
    config = Qwen2Config.from_pretrained(path)
    longest = int(batch.seq_lengths.max())
    per_layer = [config.hidden_size] * 6 + [config.intermediate_size,
                                            config.hidden_size // config.num_attention_heads, longest, longest]
    rtol = tolerances.network_rtol([int(batch.input_ids.numel()), config.vocab_size, config.hidden_size,
                                    config.hidden_size] + per_layer * config.num_hidden_layers, torch.float32)
    if torch.cuda.is_available():
        rtol += 2 * tolerances.gamma(3 + 13 * config.num_hidden_layers, torch.bfloat16)
    return rtol


def _zero_grads(backend) -> None:
    if hasattr(backend, "engine"):
        backend.engine.optimizer.zero_grad()
    else:
        backend.optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("strategy,options", CASES, ids=lambda v: str(v) if not isinstance(v, dict) else "zero3")
def test_fused_loss_matches_the_logits_path(model_path, strategy, options, monkeypatch):
    oracle = _backend(model_path, strategy, options, fused=False)
    fused = _backend(model_path, strategy, options, fused=True)
    from rl.backends import tied_grad

    shared, backward = [], tied_grad._Lookup.backward
    monkeypatch.setattr(tied_grad._Lookup, "backward", lambda ctx, g: shared.append(1) or backward(ctx, g))
    deferred, defer = [], tied_grad._Slot.defer
    monkeypatch.setattr(tied_grad._Slot, "defer", lambda slot, add_to: deferred.append(1) or defer(slot, add_to))
    for padded in (False, True):
        for name, settings in SETTINGS.items():
            batch = _batch(padded, oracle, on_policy="on_policy" in name)
            normalizer = settings.normalizer(batch.loss_mask, seq_ids=batch.token_seq_ids(),
                                             num_sequences=batch.num_sequences)
            gaps = _metric_gaps(oracle, batch, settings, normalizer)  # before the steps: a forward of its own
            want = oracle.forward_backward(batch, settings, normalizer)
            got = fused.forward_backward(batch, settings, normalizer)
            where = f"{strategy} {'padded' if padded else 'packed'} {name}"
            assert set(got) == set(want), where
            for key in want:
                assert abs(got[key] - want[key]) <= gaps[key], f"{where}: {key} {got[key]!r} vs {want[key]!r}"
            want_grads, got_grads = _grads(oracle), _grads(fused)
            assert set(got_grads) == set(want_grads)
            rtol = _grad_rtol(model_path, batch)
            for param, grad in want_grads.items():
                tolerances.assert_within(got_grads[param], grad, rtol * grad.abs().max(), f"{where}: {param}")
            assert any(float(g.abs().sum()) > 0 for g in want_grads.values())
            # tied embeddings took the one-buffer route under every wrapper (ZeRO-3 and FSDP included)
            tied = "untied" not in model_path
            assert len(shared) == (1 if tied else 0), where
            # FSDP2 computes the tied head's weight gradient at the lookup's backward (the others in the forward)
            assert len(deferred) == (1 if tied and strategy == "fsdp2" else 0), where
            shared.clear()
            deferred.clear()
            _zero_grads(oracle)
            _zero_grads(fused)


@pytest.mark.parametrize("strategy", ["fsdp2", "deepspeed"])
def test_fused_logprobs_match_the_logits_path(model_path, strategy):
    oracle = _backend(model_path, strategy, None, fused=False)
    fused = _backend(model_path, strategy, None, fused=True)
    for build in (pack_sequences, pad_sequences):
        batch = build(_sequences(3))
        want_lp, want_h = oracle.logprobs(batch, with_entropy=True)
        got_lp, got_h = fused.logprobs(batch, with_entropy=True)
        lp_gap, h_gap = _fused_logprob_gaps(oracle, batch)
        tolerances.assert_within(got_lp, want_lp, lp_gap, f"{strategy} logprobs")
        tolerances.assert_within(got_h, want_h, h_gap, f"{strategy} entropy")


def _metric_gaps(backend, batch, settings, normalizer) -> dict[str, float]:
    """Gaps of the fused loss and metrics against the logits path's: each is a weighted sum over the tokens of terms
    of a token's logprob and entropy, which the two paths compute within `_fused_logprob_gaps` of each other
    (`loss_gaps.policy_loss_gaps`, with the per-token weights of the loss's reduction)."""
    from rl.core.algorithms.kl import K3_BOUND
    from rl.kernels.reference.policy_terms import plan_loss

    lp, entropy = backend.logprobs(batch, with_entropy=True)
    lp_gap, h_gap = _fused_logprob_gaps(backend, batch)
    plan = plan_loss(settings, normalizer, batch.loss_mask, batch.token_seq_ids(), batch.num_sequences)
    weights = {"loss": plan.weight, "metric": plan.metric_weight, "token": plan.token_weight}
    gaps, _ = loss_gaps.policy_loss_gaps(lp, batch.old_logprobs, batch.ref_logprobs, batch.advantages, weights,
                                          lp_gap, h_gap, entropy, settings, K3_BOUND)
    return gaps


def _fused_logprob_gaps(backend, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token gaps ([N], 0 off the scored positions, which both paths leave at 0) of the fused path's logprobs
    and entropy against the logits path's. Both run the same model body on the same batch (the same operations), so
    the LM head's input is the same on both sides; the head's matmul (whole vs a chunk of rows) sums each logit over
    the hidden size in its own order (`tolerances.matmul_gap`), and the log-softmax and entropy over the vocabulary
    (`loss_gaps.log_softmax_gaps`, carrying that logit gap)."""
    from rl.backends.hf_forward import output_head, scored_inputs

    model = backend.forward_module()
    head = output_head(model)
    seen = {}

    def capture(module, args, out):  # inside the forward: the gathered weight (ZeRO-3, FSDP)
        weight = module.weight.full_tensor() if hasattr(module.weight, "full_tensor") else module.weight
        seen.update(hidden=args[0].reshape(-1, args[0].shape[-1]), weight=weight.detach().clone(),
                    logits=out.reshape(-1, out.shape[-1]))

    handle = head.register_forward_hook(capture)
    kwargs, targets_at = scored_inputs(batch)
    device = head.weight.device
    kwargs = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in kwargs.items()}
    model.eval()
    try:
        with torch.no_grad():
            model(**kwargs)
    finally:
        handle.remove()
    temperature = backend.spec.temperature
    logit_gap = tolerances.matmul_gap(seen["hidden"], seen["weight"].T)
    lp_gap, h_gap = loss_gaps.log_softmax_gaps(seen["logits"], batch.input_ids[targets_at].to(device), temperature,
                                                logit_gap)
    spread = lambda gap: torch.zeros(batch.num_tokens, dtype=torch.float64).index_put((targets_at,), gap.cpu())  # noqa: E731
    return spread(lp_gap), spread(h_gap)


def test_empty_rank_placeholder_runs(model_path):
    """A rank without sequences still runs forward/backward through the fused path (its collectives stay in step)."""
    fused = _backend(model_path, "fsdp2", None, fused=True)
    empty = pack_sequences(_sequences()).select([])
    settings = SETTINGS["regular-token_mean-k3"]
    full = pack_sequences(_sequences())
    normalizer = settings.normalizer(full.loss_mask, seq_ids=full.token_seq_ids(), num_sequences=full.num_sequences)
    assert fused.forward_backward(empty, settings, normalizer) == {"loss": 0.0}
