"""`trainer.bf16` on two gloo ranks, for fsdp2, fsdp, deepspeed and megatron: every gradient reduction observed at
the collective keeps float32 (its dtype, its result against the float64 sum of the ranks' inputs) and the optimizer
receives what was reduced. (Compute in bfloat16 against the float64 oracle: test_bf16.py.)"""

import contextlib
import math
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl.backends.base import ModelSpec
from rl.backends.registry import build_backend
from rl.core.packing import pack_sequences
from tests.testing import tolerances
from tests.testing.backend_steps import write_small_qwen
from tests.testing.bf16_models import SETTINGS, STRATEGIES, available, need, roundoff, torch_optimizers
from tests.testing.rendezvous import join, rendezvous

F32 = torch.float32

COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "reduce",
               "reduce_scatter", "all_reduce_coalesced")
SCATTERS = {"reduce_scatter_tensor": (0, 1), "reduce_scatter_single": (0, 1), "_reduce_scatter_base": (0, 1)}


class _ObservedReductions:
    """While active, every floating-point reduction through torch.distributed's collectives, wherever a library
    bound them (megatron keeps its reduce-scatter in a module global): its name, op, dtype, what this rank put in
    and what it got back (inside `_coalescing_manager`, which defers the collectives to its exit, read there). A
    collective that calls another is recorded once."""

    def __init__(self):
        wrappers = {name: self._observing for name in COLLECTIVES} | {"_coalescing_manager": self._coalescing}
        self.wrap = {id(getattr(dist, name)): (getattr(dist, name), name, make) for name, make in wrappers.items()}
        self.seen: list[dict] = []
        self.deferred: list[tuple[dict, torch.Tensor]] = []
        self.patched: list[tuple[object, str, object]] = []
        self.depth = self.coalescing = 0

    def __enter__(self):
        for module in list(sys.modules.values()):
            for attr, value in list(getattr(module, "__dict__", {}).items()):
                original, name, make = self.wrap.get(id(value), (None, None, None))
                if original is not None and value is original:
                    self.patched.append((module, attr, value))
                    setattr(module, attr, make(name, value))
        return self

    def __exit__(self, *exc):
        for module, attr, value in self.patched:
            setattr(module, attr, value)

    def _coalescing(self, name, original):
        @contextlib.contextmanager
        def coalescing(*args, **kwargs):
            with original(*args, **kwargs) as manager:
                self.coalescing += 1
                try:
                    yield manager
                finally:
                    self.coalescing -= 1
            if manager is not None and hasattr(manager, "wait"):
                manager.wait()
            if not self.coalescing:
                for entry, out in self.deferred:
                    entry["result"] = out.detach().clone()
                self.deferred.clear()

        return coalescing

    def _observing(self, name, original):
        def observed(*args, **kwargs):
            floating = [a for a in list(args) + list(kwargs.values())
                        if isinstance(a, torch.Tensor) and a.is_floating_point()]
            if self.depth or not floating:
                return original(*args, **kwargs)
            if name in SCATTERS:
                out, given = (kwargs.get(key, args[i] if i < len(args) else None)
                              for key, i in zip(("output", "input"), SCATTERS[name], strict=True))
            elif name == "all_reduce":
                out = given = kwargs.get("tensor", args[0] if args else None)
            else:
                out = given = None  # no value check: the test says so
            entry = {"name": name, "dtype": floating[0].dtype, "op": str(kwargs.get("op", "")),
                     "input": None if given is None else given.detach().clone(), "result": None}
            self.seen.append(entry)
            self.depth += 1
            try:
                work = original(*args, **kwargs)
            finally:
                self.depth -= 1
            if out is not None and self.coalescing:
                self.deferred.append((entry, out))
            elif out is not None:
                if work is not None and hasattr(work, "wait"):
                    work.wait()
                entry["result"] = out.detach().clone()
            return work

        return observed


def _rank_batch(rank: int):
    """Three packed sequences of random tokens and advantages, other ones on each rank."""
    g = torch.Generator().manual_seed(100 + rank)
    seqs = []
    for n in (7, 5, 9):
        mask = torch.arange(n) >= 2
        seqs.append({"input_ids": torch.randint(3, 30, (n,), generator=g), "loss_mask": mask,
                     "advantages": torch.randn(n, generator=g) * mask, "old_logprobs": -torch.rand(n, generator=g)})
    return pack_sequences(seqs)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _reduction_worker(rank: int, port: int, path: str, strategies: list[str], out: str) -> None:
    torch.set_num_threads(1)
    info = join(rank, 2, port)
    batch, results = _rank_batch(rank), {}
    for strategy in strategies:
        spec = ModelSpec(path=path, role="policy", temperature=1.0, lr=1e-2, weight_decay=0.0, bf16=True,
                         max_grad_norm=1e30)  # no clipping: the optimizer gets the reduced gradients as they are
        backend = build_backend(strategy, spec, info)
        received: list[torch.Tensor] = []

        def receive(optimizer, *_, into=received):
            into.extend(_local(p.grad).detach().clone() for group in optimizer.param_groups
                        for p in group["params"] if p.grad is not None)

        for opt in torch_optimizers(backend):
            opt.register_step_pre_hook(receive)
        normalizer = SETTINGS.normalizer(batch.loss_mask, seq_ids=batch.token_seq_ids(), num_sequences=3,
                                         dp_world_size=2)
        with _ObservedReductions() as observed:
            backend.train_micro_batches([batch], SETTINGS, normalizer)
            backend.optimizer_step()
        results[strategy] = {"seen": observed.seen, "received": received,
                             "trainable": sum(int(p.numel()) for p in backend.model.parameters() if p.requires_grad)}
        if strategy == "megatron":
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()
    torch.save(results, f"{out}.rank{rank}")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def reductions(tmp_path_factory):
    path = write_small_qwen(str(tmp_path_factory.mktemp("model")))
    out = os.path.join(path, "reductions")
    with rendezvous(2) as port:
        mp.spawn(_reduction_worker, args=(port, path, available(), out), nprocs=2)
    return [torch.load(f"{out}.rank{rank}", weights_only=False) for rank in (0, 1)]


def _reduced(calls: list[dict], op: str) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per rank: (what it got back, the float64 oracle of it, the float32 bound), the oracle being the sum (AVG: the
    mean) of both ranks' inputs, the rank's chunk of it for a reduce-scatter."""
    total = sum(c["input"].double() for c in calls)
    magnitude = sum(c["input"].double().abs() for c in calls)
    bound = tolerances.reordered_sum_gap(2, magnitude, F32)
    if "AVG" in op:
        total, bound = total / 2, bound / 2 + tolerances.unit_roundoff(F32) * (total / 2).abs()
    rows = []
    for rank, call in enumerate(calls):
        if call["name"] in SCATTERS:
            n = call["result"].numel()
            rows.append((call["result"], total[rank * n:(rank + 1) * n], bound[rank * n:(rank + 1) * n]))
        else:
            rows.append((call["result"], total, bound))
    return rows


def _assert_received(ranks: list[dict], reduced: torch.Tensor, msg: str) -> None:
    """What the torch optimizer steps on, on each rank, against the reduced gradients (their nonzero values, sorted):
    each rank its shard of them, or all of them where the optimizer is not sharded, multiplied by the power of two
    an averaging divides by after the reduction (exact in float32: one rounding u|v| allowed)."""
    assert {g.dtype for r in ranks for g in r["received"]} == {F32}, f"{msg}: the optimizer receives float32"
    held = [torch.cat([g.double().flatten() for g in r["received"]]) for r in ranks]
    held = [h[h != 0] for h in held]
    assert all(bool(torch.isfinite(h).all()) for h in held), f"{msg}: not finite"
    want = reduced[reduced != 0].sort().values
    whole = all(h.numel() == want.numel() for h in held)
    for got in (held if whole else [torch.cat(held)]):
        got = got.sort().values
        assert got.numel() == want.numel(), f"{msg}: the optimizer got {got.numel()} nonzero values of {want.numel()}"
        scale = 2.0 ** round(math.log2(float(got.abs().sum() / want.abs().sum())))
        tolerances.assert_within(got, want * scale, tolerances.unit_roundoff(F32) * (want * scale).abs(), msg=msg)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gradients_are_reduced_in_float32_on_two_ranks(reductions, strategy):
    """bf16 on two gloo ranks with other batches: every floating-point reduction the step makes runs on float32
    tensors (a scalar may be wider), the gradients' cover every parameter, each returns the float64 sum of the
    ranks' inputs to within float32 rounding of a two-term sum (a bfloat16 reduction is off by up to u_bf16, 2^16
    times more), and the optimizer receives exactly those reduced values."""
    need(strategy)
    ranks = [r[strategy] for r in reductions]
    seen = [r["seen"] for r in ranks]
    assert seen[0], "no floating-point reduction observed"
    assert [len(s) for s in seen] == [len(seen[0])] * 2, "the ranks made other reductions"
    gradients = [i for i, c in enumerate(seen[0]) if c["input"] is None or c["input"].numel() > 1]
    for call in seen[0]:
        wide_enough = call["dtype"] == F32 or (call["input"] is not None and call["input"].numel() == 1
                                               and roundoff(call["dtype"]) <= roundoff(F32))
        assert wide_enough, f"{strategy}: {call['name']} reduces {call['dtype']}: gradients are reduced in float32"
    covered = sum(seen[0][i]["input"].numel() for i in gradients if seen[0][i]["input"] is not None)
    assert covered >= ranks[0]["trainable"], f"{covered} gradient elements reduced of {ranks[0]['trainable']}"
    reduced = []
    for i in gradients:
        calls = [s[i] for s in seen]
        assert calls[0]["input"] is not None, f"{calls[0]['name']}: the test has no value check for it"
        assert not torch.equal(calls[0]["input"], calls[1]["input"]), "the ranks reduced the same gradient"
        for rank, (got, want, bound) in enumerate(_reduced(calls, calls[0]["op"])):
            assert bool(torch.isfinite(got).all()), f"{strategy} {calls[0]['name']} #{i} on rank {rank}: not finite"
            tolerances.assert_within(got, want, bound, msg=f"{strategy} {calls[0]['name']} #{i} on rank {rank}")
            if calls[0]["name"] in SCATTERS or rank == 0:
                reduced.append(got.double().flatten())
    _assert_received(ranks, torch.cat(reduced), f"{strategy}: what the optimizer receives against the reduced")


