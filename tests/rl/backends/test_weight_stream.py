"""The weight stream over a gloo group of its own (`rl.backends.weight_stream`): three processes, rank 0 sending
buckets of mixed dtypes, odd sizes and shapes (a 0-d tensor, a bf16 tensor of odd length before a float32 one),
ranks 1 and 2 receiving them bit for bit, beside a default process group that stays untouched."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl.backends.dist import connect_store
from tests.testing.rendezvous import HOST, join, rendezvous


def _buckets():
    g = torch.Generator().manual_seed(0)
    return [
        [("a.weight", torch.randn(3, 5, generator=g)), ("b.bias", torch.randn(7, generator=g).to(torch.bfloat16)),
         ("c.scale", torch.tensor(2.5)), ("d.weight", torch.randn(2, 3, generator=g))],
        [("e.ids", torch.arange(9, dtype=torch.int64)), ("f.half", torch.randn(5, generator=g).half())],
    ]


def _member(rank: int, ports: tuple[int, int], out: str) -> None:
    from rl.backends.weight_stream import join_group, receive_buckets, send_bucket, send_end

    join(rank, 3, ports[0])  # a default group, as training workers have
    group = join_group(connect_store(HOST, ports[1], 3), rank, 3, "gloo")
    if rank == 0:
        sent = sum(send_bucket(group, "gloo", bucket) for bucket in _buckets())
        send_end(group, "gloo")
        assert sent % 16 == 0
    else:
        received = [[(name, tensor.clone()) for name, tensor in bucket] for bucket in receive_buckets(group, "gloo")]
        torch.save(received, f"{out}.{rank}")
    dist.barrier()  # the default group still works
    dist.destroy_process_group()


def test_buckets_arrive_bit_for_bit(tmp_path):
    out = str(tmp_path / "received")
    with rendezvous(3) as default_port, rendezvous(3) as weights_port:
        mp.spawn(_member, args=((default_port, weights_port), out), nprocs=3)
    for rank in (1, 2):
        received = torch.load(f"{out}.{rank}")
        expected = _buckets()
        assert [[name for name, _ in b] for b in received] == [[name for name, _ in b] for b in expected]
        for got_bucket, want_bucket in zip(received, expected, strict=True):
            for (_, got), (_, want) in zip(got_bucket, want_bucket, strict=True):
                assert got.dtype == want.dtype and got.shape == want.shape
                assert torch.equal(got, want)
