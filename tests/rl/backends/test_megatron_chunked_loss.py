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
from tests.testing.loss_settings import FUSED_LOSS_SETTINGS
from tests.testing.ports import free_port

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
    logp = torch.log_softmax(hidden @ weight.T / TEMPERATURE, -1)
    lp = logp.gather(1, x["targets"][:, None]).squeeze(1)
    entropy = -(logp.exp() * logp).sum(-1) if settings.use_entropy_loss else None
    normalizer = settings.normalizer(x["mask"], seq_ids=x["seq_ids"], num_sequences=len(LENGTHS))
    old = None if "on_policy" in name else x["old"]
    loss, metrics = compute_policy_loss(settings, lp, old, x["adv"], x["mask"], normalizer, ref_logprobs=x["ref"],
                                        entropy=entropy, seq_ids=x["seq_ids"], num_sequences=len(LENGTHS))
    loss.backward()
    return loss.detach(), metrics, hidden.grad, weight.grad


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=TP)
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
    mp.spawn(_worker, args=(free_port(), out), nprocs=TP)
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(TP)]


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_tp2_chunked_loss_matches_full_logits(tp_results, name):
    loss0, metrics0, grad_hidden0, grad_weight0 = _oracle(name)
    rows = PADDED // TP
    for rank, results in enumerate(tp_results):
        loss, metrics, grad_hidden, grad_shard = results[name]
        torch.testing.assert_close(loss, loss0, atol=1e-5, rtol=1e-5)
        assert set(metrics) == set(metrics0)
        for key in metrics0:
            torch.testing.assert_close(metrics[key], metrics0[key], atol=1e-5, rtol=1e-5, msg=key)
        torch.testing.assert_close(grad_hidden, grad_hidden0, atol=1e-5, rtol=1e-4)
        want = torch.cat([grad_weight0, torch.zeros(PADDED - VOCAB, HIDDEN)])[rank * rows:(rank + 1) * rows]
        torch.testing.assert_close(grad_shard, want, atol=1e-5, rtol=1e-4)
