"""One SFT step and one DPO step (sigmoid and IPO, with an SFT term) on fsdp2, fsdp, DeepSpeed (ZeRO-2 and ZeRO-3)
in one process, and on two gloo processes sharing one data shard (megatron with TP=2, megatron with PP=2, fsdp2 with
Ulysses sequence parallelism over both), against a plain-torch oracle written here from the formulas:

- SFT: mean over the assistant tokens of -log p(token | earlier tokens), each sequence alone through transformers;
- DPO (Rafailov et al. 2023, eq. 7): -log sigmoid(beta * ((log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) -
  log pi_ref(y_l)))), log pi(y) the sum over the response's tokens, averaged over pairs; IPO (Azar et al. 2023,
  eq. 17): ((h_w - h_l) - 1 / (2 beta))^2; plus sft_loss_weight * the chosen response's mean token NLL.

The reference logprobs come from a second random model (so the margin is not 0), given to both sides. Loss, grad
norm and the weights after one AdamW step (one process), or loss, grad norm and every gradient (two), agree within
float32 rounding of the same sums in other orders (`tests.testing.tolerances`)."""

from __future__ import annotations

import math
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from rl.backends.base import ModelSpec
from rl.backends.dist import init_distributed
from rl.backends.registry import build_backend
from rl.core.algorithms import LossNormalizer
from rl.core.algorithms.dpo_loss import DpoLossSettings
from rl.core.algorithms.sft_loss import SftLossSettings
from rl.core.packing import pack_sequences
from tests.rl.backends.megatron.harness import VOCAB, _full_grads, qwen_model
from tests.testing import tolerances
from tests.testing.rendezvous import join, rendezvous

LR = 1e-2
LOSSES = {
    "sft": SftLossSettings(),
    "dpo-sigmoid": DpoLossSettings(beta=0.5, loss_type="sigmoid", sft_loss_weight=0.3, sft_average_log_probs=True),
    "ipo": DpoLossSettings(beta=0.5, loss_type="ipo"),
}
STRATEGIES = {"fsdp2": ("fsdp2", None), "fsdp": ("fsdp", None), "zero2": ("deepspeed", None),
              "zero3": ("deepspeed", {"zero_optimization": {"stage": 3}})}


def _sequences(kind: str) -> list[dict]:
    """SFT: three conversations, assistant tokens from position 3 on. DPO: two pairs (chosen, rejected) sharing a
    prompt of 3 tokens each, responses of different lengths."""
    g = torch.Generator().manual_seed(5)
    if kind == "sft":
        out = []
        for n in (7, 11, 5):
            out.append({"input_ids": torch.randint(1, VOCAB, (n,), generator=g), "loss_mask": torch.arange(n) >= 3})
        return out
    out = []
    for chosen, rejected in ((4, 6), (5, 3)):
        prompt = torch.randint(1, VOCAB, (3,), generator=g)
        for length in (chosen, rejected):
            ids = torch.cat([prompt, torch.randint(1, VOCAB, (length,), generator=g)])
            out.append({"input_ids": ids, "loss_mask": torch.arange(len(ids)) >= 3})
    return out


def _token_logprobs(model, seqs) -> list[torch.Tensor]:
    """Each sequence alone: entry t holds log p(ids[t] | ids[<t]) (0 at t = 0)."""
    out = []
    for s in seqs:
        logits = model(input_ids=s["input_ids"][None]).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, s["input_ids"][1:, None])[:, 0]
        out.append(torch.cat([lp.new_zeros(1), lp]))
    return out


def _oracle_loss(name: str, logprobs, seqs, ref) -> torch.Tensor:
    settings = LOSSES[name]
    if name == "sft":
        total = sum((-lp * s["loss_mask"]).sum() for lp, s in zip(logprobs, seqs, strict=True))
        return total / sum(int(s["loss_mask"].sum()) for s in seqs)
    logp = [(lp * s["loss_mask"]).sum() for lp, s in zip(logprobs, seqs, strict=True)]
    ref_logp = [(r * s["loss_mask"]).sum() for r, s in zip(ref, seqs, strict=True)]
    losses = []
    for k in range(0, len(seqs), 2):
        h = (logp[k] - ref_logp[k]) - (logp[k + 1] - ref_logp[k + 1])
        if settings.loss_type == "sigmoid":
            loss = -F.logsigmoid(settings.beta * h)
        else:
            loss = (h - 1 / (2 * settings.beta)) ** 2
        chosen_nll = -(logprobs[k] * seqs[k]["loss_mask"]).sum() / seqs[k]["loss_mask"].sum()
        losses.append(loss + settings.sft_loss_weight * chosen_nll)
    return torch.stack(losses).mean()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return qwen_model(tmp_path_factory.mktemp("policy"), hidden=32, layers=2)


@pytest.fixture(scope="module")
def ref_logprobs(tmp_path_factory):
    """The reference model's logprobs of the DPO sequences: another random model."""
    torch.manual_seed(1)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    with torch.no_grad():
        return [lp.detach() for lp in _token_logprobs(Qwen2ForCausalLM(config).eval(), _sequences("dpo"))]


def _batch(name, ref):
    seqs = _sequences("sft" if name == "sft" else "dpo")
    if name != "sft":
        seqs = [{**s, "ref_logprobs": r} for s, r in zip(seqs, ref, strict=True)]
    return pack_sequences(seqs), seqs


def _normalizer(seqs) -> LossNormalizer:
    return LossNormalizer.from_counts("token_mean", sum(int(s["loss_mask"].sum()) for s in seqs), len(seqs))


def _oracle_step(model_path, name, ref):
    """(loss, grads, grad norm, weights after one clipped AdamW step) of transformers on the formulas above."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    _, seqs = _batch(name, ref)
    loss = _oracle_loss(name, _token_logprobs(model, seqs), seqs, ref)
    loss.backward()
    params = dict(model.named_parameters())
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    norm = float(torch.nn.utils.clip_grad_norm_(params.values(), 1.0))
    optimizer = torch.optim.AdamW(params.values(), lr=LR, weight_decay=0.0)
    optimizer.step()
    return float(loss.detach()), grads, norm, {n: p.detach().clone() for n, p in model.state_dict().items()}


def _rtol(model_path, seqs) -> float:
    config = AutoConfig.from_pretrained(model_path)
    positions = max(len(s["input_ids"]) for s in seqs)
    return tolerances.network_rtol(tolerances.decoder_reductions(config, positions, sum(len(s["input_ids"])
                                                                                       for s in seqs)), torch.float32)


def _loss_bound(name, model_path, seqs, loss) -> float:
    """Every logprob within d = rtol * max|logit| of the oracle's; a DPO log-ratio margin sums a pair's response
    tokens, so it moves by at most m = (tokens of the pair) * d; |dl/dh| is at most beta for the sigmoid and
    2|h - 1/(2 beta)| + m for IPO; the SFT term is a mean of logprobs (moves by d); plus the loss's own rounding."""
    rtol = _rtol(model_path, seqs)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        logit_max = max(float(model(input_ids=s["input_ids"][None]).logits.abs().max()) for s in seqs)
    d = rtol * logit_max
    if name == "sft":
        return d + rtol * abs(loss)
    settings = LOSSES[name]
    pair_tokens = max(int(seqs[k]["loss_mask"].sum() + seqs[k + 1]["loss_mask"].sum()) for k in (0, 2))
    m = pair_tokens * d
    slope = settings.beta if settings.loss_type == "sigmoid" else 2 * math.sqrt(abs(loss)) + 2 / settings.beta + m
    return slope * m + settings.sft_loss_weight * d + rtol * abs(loss)


@pytest.fixture(scope="module", autouse=True)
def _process_group():
    init_distributed(0, 1, "127.0.0.1", 0)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("name", list(LOSSES))
def test_one_step_matches_the_formula_oracle(model_path, ref_logprobs, strategy, name):
    backend_name, options = STRATEGIES[strategy]
    spec = ModelSpec(path=model_path, role="policy", temperature=1.0, lr=LR, weight_decay=0.0,
                     backend_options=options)
    backend = build_backend(backend_name, spec, init_distributed(0, 1, "127.0.0.1", 0))
    batch, seqs = _batch(name, ref_logprobs)
    got = backend.forward_backward(batch, LOSSES[name], _normalizer(seqs))
    stepped = backend.optimizer_step()
    loss, grads, norm, weights = _oracle_step(model_path, name, ref_logprobs)
    if name != "sft":
        assert abs(got["dpo_loss"] - math.log(2)) > 1e-3, "the reference differs from the policy: a real margin"
    bound = _loss_bound(name, model_path, seqs, loss)
    print(f"{strategy} {name}: loss {loss:.6f} gap {abs(got['loss'] - loss):.3g} bound {bound:.3g}; grad norm gap "
          f"{abs(stepped['grad_norm'] - norm):.3g}")
    tolerances.assert_within(torch.tensor(got["loss"]), torch.tensor(loss), bound, "loss")
    rtol = _rtol(model_path, seqs)
    gaps = {n: rtol * float(g.abs().max()) for n, g in grads.items()}
    norm_gap = math.sqrt(sum(grads[n].numel() * gap**2 for n, gap in gaps.items())) + rtol * norm
    tolerances.assert_within(torch.tensor(stepped["grad_norm"]), torch.tensor(norm), norm_gap, "grad_norm")
    clip = min(1.0, 1.0 / (norm + 1e-6))
    state = backend.full_state_dict()
    for n, value in weights.items():
        if n not in grads:
            continue
        bound = tolerances.adam_gap([grads[n] * clip], [gaps[n] * clip + rtol * clip * grads[n].abs().max()], LR)
        bound += 2 * 2 * tolerances.unit_roundoff(torch.float32) * value.abs().double()
        tolerances.assert_within(state[n], value, bound, msg=f"{strategy} {name} {n}")


# two ranks sharing one data shard: (strategy, its options, Ulysses sequence-parallel size)
TWO_RANK_LAYOUTS = {"megatron-tp2": ("megatron", {"tensor_model_parallel_size": 2}, 1),
                    "megatron-pp2": ("megatron", {"pipeline_model_parallel_size": 2}, 1),
                    "fsdp2-ulysses2": ("fsdp2", None, 2)}


def _two_rank_worker(rank, world, port, model_path, ref, out):
    torch.set_num_threads(1)
    info = join(rank, world, port)
    results = {}
    for layout, (strategy, options, ulysses) in TWO_RANK_LAYOUTS.items():
        for name in LOSSES:
            spec = ModelSpec(path=model_path, role="policy", temperature=1.0, lr=LR, max_grad_norm=1e9,
                             backend_options=options, sequence_parallel_size=ulysses, bf16=False)
            backend = build_backend(strategy, spec, info)
            batch, seqs = _batch(name, ref)
            metrics = backend.train_micro_batches([batch], LOSSES[name], _normalizer(seqs))
            norm = backend.clip_grad_norm()
            grads = _full_grads(backend, strategy)
            everyone: list = [None] * world
            dist.all_gather_object(everyone, metrics)
            results[layout, name] = {"metrics": next(m for m in everyone if m is not None), "grads": grads,
                                     "norm": norm}
            if strategy == "megatron":
                from megatron.core import parallel_state

                parallel_state.destroy_model_parallel()
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def test_two_ranks_of_one_shard_match_the_formula_oracle(model_path, ref_logprobs):
    """megatron with TP=2 and with PP=2, fsdp2 with Ulysses over 2 ranks: loss, every gradient and the norm."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        with rendezvous(2) as port:
            mp.spawn(_two_rank_worker, args=(2, port, model_path, ref_logprobs, out), nprocs=2)
        results = torch.load(out, weights_only=False)
    for (layout, name), got in results.items():
        _, seqs = _batch(name, ref_logprobs)
        loss, grads, norm, _ = _oracle_step(model_path, name, ref_logprobs)
        bound = _loss_bound(name, model_path, seqs, loss)
        rtol = _rtol(model_path, seqs)
        worst = max(float(((got["grads"][n] - g).abs().max()) / g.abs().max()) for n, g in grads.items())
        print(f"{layout} {name}: loss gap {abs(got['metrics']['loss'] - loss):.3g} bound {bound:.3g}; worst "
              f"gradient gap / max|g| {worst:.3g} (bound {rtol:.3g})")
        tolerances.assert_within(torch.tensor(got["metrics"]["loss"]), torch.tensor(loss), bound,
                                 f"{layout} {name} loss")
        for n, grad in grads.items():
            tolerances.assert_within(got["grads"][n], grad, rtol * float(grad.abs().max()), f"{layout} {name} {n}")
        gaps = {n: rtol * float(g.abs().max()) for n, g in grads.items()}
        norm_gap = math.sqrt(sum(grads[n].numel() * gap**2 for n, gap in gaps.items())) + rtol * norm
        tolerances.assert_within(torch.tensor(got["norm"]), torch.tensor(norm), norm_gap, f"{layout} {name} norm")
