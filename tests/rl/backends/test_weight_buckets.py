"""`TrainingBackend.weight_buckets`, what the generation engines are fed after each step, against the backend's own
`full_state_dict` (the oracle): the same tensors under the same Hugging Face names, split into buckets of about the
asked size, on rank 0 only, for every strategy on 2 gloo workers (each gathers one piece at a time: fsdp2 a
parameter, fsdp a unit, DeepSpeed ZeRO-3 a group of parameters, megatron a decoder layer). Tied weights may come
once, under the embedding's name. Where a strategy yields them on every rank (`device_buckets`: fsdp2, fsdp,
deepspeed), each rank holds the same buckets as rank 0's `weight_buckets`, with the same values, on its own device.
The same backends' training checkpoints read back in one process (`checkpoint_weights`) hold the same weights."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.testing.rendezvous import join, rendezvous

LAYOUTS = {
    "fsdp2": ("fsdp2", None),
    "fsdp": ("fsdp", None),
    "fsdp-shard-grad-op": ("fsdp", {"reshard_after_forward": False}),
    "deepspeed-zero2": ("deepspeed", None),
    "deepspeed-zero3": ("deepspeed", {"train": {"zero_optimization": {"stage": 3}}}),
    "megatron-tp2": ("megatron", {"tensor_model_parallel_size": 2}),
    "megatron-pp2": ("megatron", {"pipeline_model_parallel_size": 2}),
    "megatron-dp2": ("megatron", None),
}
BUCKET_BYTES = 40_000  # a few parameters per bucket


def _worker(rank: int, port: int, path: str, out: str) -> None:
    from rl.backends.base import ModelSpec
    from rl.backends.registry import build_backend
    from rl.backends.weight_sync import gathers_on_every_rank
    from rl.core.algorithms import LossSettings
    from rl.core.packing import pack_sequences

    torch.set_num_threads(1)
    info = join(rank, 2, port)
    g = torch.Generator().manual_seed(rank)
    batch = pack_sequences([{"input_ids": torch.randint(1, 61, (12,), generator=g),
                             "loss_mask": torch.arange(12) >= 4, "advantages": torch.randn(12, generator=g)}])
    settings = LossSettings()
    results = {}
    for name, (strategy, options) in LAYOUTS.items():
        spec = ModelSpec(path=path, role="policy", temperature=1.0, lr=1e-2, backend_options=options)
        backend = build_backend(strategy, spec, info)
        # one optimizer step first: the buckets must carry the trained weights, not the checkpoint's
        normalizer = settings.normalizer(batch.loss_mask, seq_ids=batch.token_seq_ids(), num_sequences=1,
                                         dp_world_size=2)
        backend.train_micro_batches([batch], settings, normalizer)
        backend.optimizer_step()
        buckets = list(backend.weight_buckets(BUCKET_BYTES))
        if gathers_on_every_rank(backend):
            torch.save(list(backend.device_buckets(BUCKET_BYTES)), f"{out}.{name}.rank{rank}")
        full = backend.full_state_dict()
        saved = os.path.join(os.path.dirname(out), f"checkpoint-{name}")
        backend.save_checkpoint(saved)
        dist.barrier()
        results[name] = {"buckets": buckets, "full": full,
                         "checkpoint": type(backend).checkpoint_weights(saved, path) if rank == 0 else None}
        if strategy == "megatron":
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()
        if rank != 0:
            assert all(not bucket for bucket in buckets), "only rank 0 holds bucket contents"
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=61, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=64)
    path = str(tmp_path_factory.mktemp("model"))
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    out = os.path.join(path, "results.pt")
    with rendezvous(2) as port:
        mp.spawn(_worker, args=(port, path, out), nprocs=2)
    results = torch.load(out, weights_only=False)
    for name, result in results.items():
        result["initial"] = model.state_dict()
        held = [f"{out}.{name}.rank{rank}" for rank in (0, 1)]
        result["device"] = [torch.load(f, weights_only=False) for f in held] if os.path.exists(held[0]) else None
    return results


@pytest.mark.parametrize("layout", LAYOUTS)
def test_buckets_hold_the_full_state_in_pieces_of_the_asked_size(results, layout):
    buckets, full = results[layout]["buckets"], results[layout]["full"]
    assert len(buckets) > 2
    sent = dict(item for bucket in buckets for item in bucket)
    assert sum(len(bucket) for bucket in buckets) == len(sent), "no name twice"
    assert set(full) - set(sent) <= {"lm_head.weight"}, "only a tied alias may be left out"
    for name, tensor in sent.items():
        assert torch.equal(tensor, full[name]), name
        assert tensor.device.type == "cpu"
    initial = results[layout]["initial"]
    assert any(not torch.allclose(sent[n], initial[n]) for n in sent), "trained weights differ from the checkpoint"
    sizes = [sum(t.numel() * t.element_size() for _, t in bucket) for bucket in buckets]
    biggest = max(t.numel() * t.element_size() for t in sent.values())
    assert all(size < BUCKET_BYTES + biggest for size in sizes)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_training_checkpoint_reads_back_as_the_trained_weights(results, layout):
    """`checkpoint_weights` (what `rl.launch.convert --direction=checkpoint_to_hf` writes out) merges both ranks'
    files of a training checkpoint into the weights the backend itself gathers."""
    read, full = results[layout]["checkpoint"], results[layout]["full"]
    assert set(full) - set(read) <= {"lm_head.weight"} and set(read) - set(full) <= {"lm_head.weight"}
    for name, tensor in read.items():
        assert tensor.device.type == "cpu" and tensor.dtype == torch.float32, name
        torch.testing.assert_close(tensor, full[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("layout", [name for name, (strategy, _) in LAYOUTS.items() if strategy != "megatron"])
def test_every_rank_holds_the_same_buckets_on_its_device(results, layout):
    """`device_buckets` on both ranks against rank 0's `weight_buckets` (itself held to `full_state_dict` above)."""
    want, held = results[layout]["buckets"], results[layout]["device"]
    assert held is not None, "the strategy yields no buckets on every rank"
    for rank, got in enumerate(held):
        assert [[name for name, _ in bucket] for bucket in got] == [[name for name, _ in bucket] for bucket in want]
        for bucket, expected in zip(got, want, strict=True):
            for (name, tensor), (_, value) in zip(bucket, expected, strict=True):
                assert tensor.device.type == "cpu" and torch.equal(tensor, value), (rank, name)  # gloo: CPU ranks
