"""Buckets shared by handle (`rl.core.generation.shared_weights`): a bucket of mixed dtypes, odd sizes and shapes
laid out in a /dev/shm buffer arrives bit for bit in another process, which maps it without a copy of its own; a
tied alias views the same bytes; a handle for another device is refused naming both devices; the file is gone once
the sender closes it."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from rl.core.generation.shared_weights import (
    SharedBuffer,
    device_key,
    fill,
    handle_for,
    layout,
    load_shared,
    unpack,
    with_aliases,
)


def _bucket():
    g = torch.Generator().manual_seed(0)
    return [("a.weight", torch.randn(3, 5, generator=g)), ("b.bias", torch.randn(7, generator=g).to(torch.bfloat16)),
            ("c.scale", torch.tensor(2.5)), ("d.ids", torch.arange(9, dtype=torch.int64)),
            ("e.half", torch.randn(5, generator=g).half())]


def _receive(handles, entries, out):
    bucket = load_shared(handles, entries, device_key("cpu"))
    torch.save([(name, tensor.clone()) for name, tensor in bucket], out)
    bucket[0][1].fill_(7.0)  # the mapping is shared: the sender sees it (so the receiver copied nothing)


def test_a_bucket_arrives_bit_for_bit_in_another_process(tmp_path):
    bucket = _bucket()
    entries, size = layout(bucket)
    assert [offset % 16 for *_, offset in entries] == [0] * len(entries)
    assert size == 64 + 16 + 16 + 80 + 16  # each tensor padded to 16 bytes
    buffer = SharedBuffer(size, "cpu")
    buffer.fill(bucket, entries)
    out = str(tmp_path / "received")
    child = mp.get_context("spawn").Process(target=_receive, args=({device_key("cpu"): buffer.handle}, entries, out))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    received = torch.load(out)
    assert [name for name, _ in received] == [name for name, _ in bucket]
    for (_, got), (_, want) in zip(received, bucket, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert torch.equal(unpack(buffer.tensor, entries)[0][1], torch.full((3, 5), 7.0))
    path = buffer.path
    buffer.close()
    assert not os.path.exists(path)


def test_aliases_view_the_same_bytes_once():
    bucket = [("model.embed_tokens.weight", torch.randn(4, 2)), ("model.norm.weight", torch.ones(2))]
    entries, size = layout(bucket)
    aliases = {"model.embed_tokens.weight": "lm_head.weight"}
    aliased = with_aliases(entries, aliases)
    assert aliased[-1] == ("lm_head.weight", "float32", (4, 2), 0)
    assert with_aliases(aliased, aliases) == aliased  # already there: not twice
    flat = torch.zeros(size, dtype=torch.uint8)
    fill(flat, bucket, entries)
    views = dict(unpack(flat, aliased))
    assert torch.equal(views["lm_head.weight"], bucket[0][1])
    assert views["lm_head.weight"].data_ptr() == views["model.embed_tokens.weight"].data_ptr()


def test_a_handle_for_another_device_is_refused_naming_both():
    with pytest.raises(RuntimeError, match=r"shared on \['cuda:GPU-1'\] and this engine worker is on host:"):
        handle_for({"cuda:GPU-1": ("cuda", b"")}, device_key("cpu"))
