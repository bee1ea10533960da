"""Ulysses sequence parallelism (`trainer.policy.sequence_parallel_size`) on fsdp2 and fsdp: SP=2 on 2 ranks and
SP=2 x DP=2 on 4 give the loss, metrics, logprobs, entropy, gradients and grad norm of SP=1 on one rank, with and
without gradient checkpointing, for a packed row whose sequences cross the slice boundary, of odd total length,
with one-token sequences, and for a model with fewer KV heads than ranks (repeated)."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen2Config, Qwen2ForCausalLM

from rl.core.algorithms import LossNormalizer, LossSettings
from rl.core.packing import pack_sequences
from tests.rl.backends.megatron.harness import _full_grads, assert_same_step, reported
from tests.testing.rendezvous import join, rendezvous

VOCAB = 61
LENGTHS = (1, 7, 12, 3, 9, 1, 5, 11)  # 49 tokens: odd, one-token sequences, a sequence across every cut
TEMPERATURE = 0.9
SETTINGS = LossSettings(use_kl_loss=False, entropy_loss_coef=0.01, use_entropy_loss=True)


def sequences() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for n in LENGTHS:
        mask = torch.arange(n) >= 1
        out.append({"input_ids": torch.randint(1, VOCAB, (n,), generator=g), "loss_mask": mask,
                    "advantages": torch.randn(n, generator=g) * mask,
                    "old_logprobs": -torch.rand(n, generator=g) * mask})
    return out


def _model(directory: str, kv_heads: int) -> str:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, tie_word_embeddings=True,
                         max_position_embeddings=64)
    path = os.path.join(directory, f"kv{kv_heads}")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def _one_step(info, layout: dict, paths: dict) -> dict:
    from rl.backends.base import ModelSpec
    from rl.backends.registry import build_backend

    torch.manual_seed(0)
    spec = ModelSpec(path=paths[layout.get("kv_heads", 2)], role="policy", temperature=TEMPERATURE, lr=1e-2,
                     max_grad_norm=1e9, gradient_checkpointing=layout.get("checkpointing", False),
                     sequence_parallel_size=layout.get("sp", 1))
    backend = build_backend(layout["strategy"], spec, info)
    place = backend.data_parallel_rank()
    seqs = sequences()
    per_shard = -(-len(seqs) // place.size)
    batch = pack_sequences(seqs[place.index * per_shard:(place.index + 1) * per_shard])
    logprobs, entropy = backend.logprobs(batch, with_entropy=True)
    tokens = sum(int(s["loss_mask"].sum()) for s in seqs)
    normalizer = LossNormalizer.from_counts("token_mean", tokens, len(seqs), dp_world_size=place.size)
    metrics = backend.train_micro_batches([batch], SETTINGS, normalizer)
    summed: dict[str, float] = {}
    for shard in reported(metrics, place):
        for name, value in shard.items():
            summed[name] = summed.get(name, 0.0) + value
    norm = backend.clip_grad_norm()
    grads = _grads(backend, layout["strategy"])
    shards = reported((logprobs, entropy), place)
    return {"metrics": summed, "grad_norm": norm, "grads": grads, "dp": place.size,
            "logprobs": torch.cat([lp for lp, _ in shards]), "entropy": torch.cat([e for _, e in shards])}


def _grads(backend, strategy: str) -> dict[str, torch.Tensor]:
    if strategy != "fsdp":
        return _full_grads(backend, strategy)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(backend.model, with_grads=True):
        return {name.replace("_fsdp_wrapped_module.", ""): p.grad.clone()
                for name, p in backend.model.named_parameters()}


def _worker(rank: int, world: int, port: int, layouts: list[dict], paths: dict, out: str) -> None:
    torch.set_num_threads(1)
    info = join(rank, world, port)
    results = [_one_step(info, layout, paths) for layout in layouts]
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def run(world: int, layouts: list[dict], paths: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        with rendezvous(world) as port:
            mp.spawn(_worker, args=(world, port, layouts, paths, out), nprocs=world)
        return torch.load(out, weights_only=False)


LAYOUTS = {  # name -> (world, layout)
    "fsdp2-sp2": (2, {"strategy": "fsdp2", "sp": 2}),
    "fsdp2-sp2-checkpointing": (2, {"strategy": "fsdp2", "sp": 2, "checkpointing": True}),
    "fsdp-sp2": (2, {"strategy": "fsdp", "sp": 2}),
    "fsdp2-sp2-one-kv-head": (2, {"strategy": "fsdp2", "sp": 2, "kv_heads": 1}),
    "fsdp2-sp2xdp2": (4, {"strategy": "fsdp2", "sp": 2}),
    "fsdp-sp2xdp2-checkpointing": (4, {"strategy": "fsdp", "sp": 2, "checkpointing": True}),
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[int, str]:
    directory = str(tmp_path_factory.mktemp("models"))
    return {kv: _model(directory, kv) for kv in (2, 1)}


@pytest.fixture(scope="module")
def results(paths) -> dict[str, dict]:
    out = {}
    reference = [{"strategy": "fsdp2"}, {"strategy": "fsdp2", "kv_heads": 1}]
    out["sp1"], out["sp1-one-kv-head"] = run(1, reference, paths)
    for world in (2, 4):
        names = [name for name, (w, _) in LAYOUTS.items() if w == world]
        out.update(zip(names, run(world, [LAYOUTS[name][1] for name in names], paths), strict=True))
    return out


@pytest.mark.parametrize("name", LAYOUTS)
def test_sequence_parallel_step_matches_one_rank(paths, results, name):
    """Within the rounding of float32 computations of the same step in other orders (the harness's
    `assert_same_step`: bounds from this model's reductions, its logits and the sequences' losses)."""
    got = results[name]
    want = results["sp1-one-kv-head" if "one-kv-head" in name else "sp1"]
    assert got["dp"] == LAYOUTS[name][0] // 2
    assert got["grads"].keys() == want["grads"].keys()
    assert_same_step(got, want, paths[LAYOUTS[name][1].get("kv_heads", 2)], sequences(), TEMPERATURE, SETTINGS)
