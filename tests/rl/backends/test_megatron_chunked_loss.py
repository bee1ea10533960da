"""rl/backends/megatron/chunked_loss.py at TP=2 (two gloo processes, the weight split by vocabulary rows, the last
row padding) against the single-process oracle: full logits, eager log-softmax and `compute_policy_loss`. Loss,
metrics and the gradients of the hidden states and of each rank's weight shard must agree."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl.backends.megatron.chunked_loss import copy_to_group, vocab_parallel_chunked_loss
from rl.core.algorithms import compute_policy_loss
from rl.core.algorithms.kl import K3_BOUND
from rl.kernels.reference.policy_terms import plan_loss
from tests.testing.loss_gaps import log_softmax_gaps, log_softmax_grad_gap, policy_loss_gaps
from tests.testing.loss_settings import FUSED_LOSS_SETTINGS
from tests.testing.rendezvous import join, rendezvous
from tests.testing.tolerances import assert_within, matmul_gap

VOCAB, PADDED, HIDDEN, TP = 37, 38, 8, 2
LENGTHS = [5, 1, 9, 4]
TEMPERATURE = 0.9

SETTINGS = FUSED_LOSS_SETTINGS


def _inputs():
    g = torch.Generator().manual_seed(0)
    n = sum(LENGTHS)
    hidden = torch.randn(n, HIDDEN, generator=g)
    weight = torch.randn(PADDED, HIDDEN, generator=g)
    targets = torch.randint(0, VOCAB, (n,), generator=g)
    base = torch.log_softmax(hidden @ weight[:VOCAB].T / TEMPERATURE, -1).gather(1, targets[:, None]).squeeze(1)
    return {
        "hidden": hidden, "weight": weight, "targets": targets, "adv": torch.randn(n, generator=g),
        "old": base + 0.4 * torch.randn(n, generator=g), "ref": base + 0.4 * torch.randn(n, generator=g),
        "mask": torch.rand(n, generator=g) > 0.2,
        "seq_ids": torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS)),
    }


def _oracle(name):
    settings, x = SETTINGS[name], _inputs()
    hidden, weight = x["hidden"].clone().requires_grad_(), x["weight"][:VOCAB].clone().requires_grad_()
    logits = hidden @ weight.T
    logp = torch.log_softmax(logits / TEMPERATURE, -1)
    lp = logp.gather(1, x["targets"][:, None]).squeeze(1)
    entropy = -(logp.exp() * logp).sum(-1)
    normalizer = settings.normalizer(x["mask"], seq_ids=x["seq_ids"], num_sequences=len(LENGTHS))
    old = None if "on_policy" in name else x["old"]
    loss, metrics = compute_policy_loss(settings, lp, old, x["adv"], x["mask"], normalizer, ref_logprobs=x["ref"],
                                        entropy=entropy if settings.use_entropy_loss else None, seq_ids=x["seq_ids"],
                                        num_sequences=len(LENGTHS))
    grad_hidden, grad_weight, grad_logits, w1, w2 = torch.autograd.grad(loss, (hidden, weight, logits, lp, entropy),
                                                                        allow_unused=True)
    return {"loss": loss.detach(), "metrics": metrics, "grad_hidden": grad_hidden, "grad_weight": grad_weight,
            "bounds": _bounds(settings, x, normalizer, old, logits, lp, entropy, grad_logits, w1, w2)}


def _bounds(settings, x, normalizer, old, logits, lp, entropy, grad_logits, w1, w2):
    """Each rank computes its vocabulary rows' logits a chunk at a time (`matmul_gap` over the hidden size), the
    log-softmax over both ranks' rows (the vocabulary's sums split in two and all-reduced: `log_softmax_gaps`), the
    loss and metrics over the tokens (`policy_loss_gaps`, the kernels' per-token weights), the logits' gradient
    (`log_softmax_grad_gap`; each weight a few roundings of its own: 4 more terms; its slope moving along the
    logprob gap), then hidden's gradient over the vocabulary (all-reduced over the ranks) and each row's of the
    weight over the tokens (`matmul_gap`)."""
    hidden, weight = x["hidden"], x["weight"][:VOCAB]
    logit_gap = matmul_gap(hidden, weight.T)
    lp_gap, h_gap = log_softmax_gaps(logits, x["targets"], TEMPERATURE, logit_gap)
    plan = plan_loss(settings, normalizer, x["mask"], x["seq_ids"], len(LENGTHS))
    weights = {"loss": plan.weight, "metric": plan.metric_weight, "token": plan.token_weight}
    value_gaps, slope_gap = policy_loss_gaps(lp, old, x["ref"], x["adv"], weights, lp_gap, h_gap, entropy, settings,
                                             K3_BOUND)
    grad_gap = log_softmax_grad_gap(logits, x["targets"], w1, w2, TEMPERATURE, [VOCAB, VOCAB, 4], logit_gap,
                                    slope_gap)
    return {"values": value_gaps, "grad_hidden": matmul_gap(grad_logits, weight, grad_gap),
            "grad_weight": matmul_gap(grad_logits.T, hidden, grad_gap.T)}


def _worker(rank, port, out_dir):
    join(rank, TP, port)
    torch.set_num_threads(1)
    try:
        x = _inputs()
        rows = PADDED // TP
        results = {}
        for name, settings in SETTINGS.items():
            hidden = x["hidden"].clone().requires_grad_()
            shard = x["weight"][rank * rows:(rank + 1) * rows].clone().requires_grad_()
            normalizer = settings.normalizer(x["mask"], seq_ids=x["seq_ids"], num_sequences=len(LENGTHS))
            loss, metrics = vocab_parallel_chunked_loss(
                settings, copy_to_group(hidden, None), shard, x["targets"], None if "on_policy" in name else x["old"],
                x["adv"], x["mask"], normalizer, vocab_start=rank * rows, vocab_size=VOCAB, ref_logprobs=x["ref"],
                seq_ids=x["seq_ids"], num_sequences=len(LENGTHS), temperature=TEMPERATURE, chunk_size=4,
            )
            loss.backward()
            results[name] = (loss.detach(), metrics, hidden.grad, shard.grad)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp_results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tp"))
    with rendezvous(TP) as port:
        mp.spawn(_worker, args=(port, out), nprocs=TP)
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(TP)]


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_tp2_chunked_loss_matches_full_logits(tp_results, name):
    want = _oracle(name)
    bounds = want["bounds"]
    rows = PADDED // TP
    padding = torch.zeros(PADDED - VOCAB, HIDDEN)
    weight0 = torch.cat([want["grad_weight"], padding])
    weight_gap = torch.cat([bounds["grad_weight"], padding.double()])  # the padding row's gradient is exactly 0
    for rank, results in enumerate(tp_results):
        loss, metrics, grad_hidden, grad_shard = results[name]
        assert_within(loss, want["loss"], bounds["values"]["loss"], f"rank {rank} loss")
        assert set(metrics) == set(want["metrics"])
        for key, value in want["metrics"].items():
            assert_within(metrics[key], value, bounds["values"][key], f"rank {rank} {key}")
        assert_within(grad_hidden, want["grad_hidden"], bounds["grad_hidden"], f"rank {rank} hidden gradient")
        shard = slice(rank * rows, (rank + 1) * rows)
        assert_within(grad_shard, weight0[shard], weight_gap[shard], f"rank {rank} weight gradient")
